"""Benchmark tasks of lm-evaluation-harness in an experiment (`evaluate.tasks`), checked before any job.

An entry of `evaluate.tasks` is one of:

* a task, group or tag name of lm-evaluation-harness's own registry (`lambada_openai`, `wikitext`,
  `blimp`); the harness reads its data from the Hugging Face Hub, so these need a network (or the
  Hub's cache);
* a folder of task YAMLs, given by path as lm-eval's `--include_path` takes them: every task its
  YAMLs define runs (a folder holds the files it reads, so it works offline);
* `growlm_cloze`, the task growlm ships (`workflow/resources/tasks/growlm_cloze/`): the last word of
  each held-out unit of the evaluated level (its test split), predicted from the words before it, as
  LAMBADA does for novels. The workflow writes its data from the experiment's own test text (rule
  `cloze_task`), so it needs no download and measures the text the models were trained for.

Each entry is one job per model (`results/.../eval/<model>/tasks/<id>.json`), so adding a task
runs only that task, and one task that fails leaves the others in place.

`task_problems` names, in one line each and before any job, an entry lm-evaluation-harness does not
know, a folder that is missing or whose YAML does not parse, and a missing lm-evaluation-harness.
The registry's names are read once per installed version of the harness (indexing its few thousand
YAML files takes seconds) and kept in `~/.cache/growlm/`; the look-up runs in a child process
(`python -m growlm.tasks`), so the workflow's parse imports nothing of the harness.

Torch-free: the Snakefile imports it.
"""

from __future__ import annotations

import difflib
import importlib.metadata
import importlib.util
import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

from growlm.atomic import write_json_atomic
from growlm.errors import GrowlmError, package_env

# the tasks growlm ships, by name: the folder under workflow/resources/tasks/ that holds each one's YAML
BUNDLED = ("growlm_cloze",)
CLOZE_MAX_EXAMPLES = 2000  # enough for a standard error of about 1 point of accuracy, seconds per model on a CPU
CLOZE_MIN_WORDS = 4  # a unit shorter than this leaves too little context to predict its last word
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "growlm"


def is_folder(entry: str) -> bool:
    """An entry names a folder when it has a path separator or a folder of that name exists."""
    return "/" in entry or os.sep in entry or Path(entry).is_dir()


def task_id(entry: str) -> str:
    """The file-name-safe id of an entry: the task name itself, or a folder's name ('my_tasks' for
    'tasks/my_tasks/')."""
    name = Path(entry.rstrip("/")).name if is_folder(entry) else entry
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


def task_specs(entries: list[str], *, bundled_dir) -> list[dict]:
    """What each evaluation job runs: `{"id", "name", "folder", "bundled"}` per entry, `name` the
    task to run (None: every task of `folder`), `folder` the include path (None: the registry's
    task). A bundled task's folder is the one the workflow writes (`bundled_dir/<name>`)."""
    specs = []
    for entry in entries:
        if entry in BUNDLED:
            specs.append({"id": entry, "name": entry, "folder": f"{bundled_dir}/{entry}", "bundled": True})
        elif is_folder(entry):
            specs.append({"id": task_id(entry), "name": None, "folder": str(entry).rstrip("/"), "bundled": False})
        else:
            specs.append({"id": entry, "name": entry, "folder": None, "bundled": False})
    return specs


# ----------------------------------------------------------------------------------------------
# before any job: is every entry something the harness can run
# ----------------------------------------------------------------------------------------------

def harness_version() -> str | None:
    """The installed lm-evaluation-harness's version, None when it is not installed."""
    if importlib.util.find_spec("lm_eval") is None:
        return None
    try:
        return importlib.metadata.version("lm_eval")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _ask(args: list[str]) -> dict:
    """Run this module's command line in a child process (the harness's imports and logging stay there)."""
    proc = subprocess.run([sys.executable, "-m", "growlm.tasks", *args], env=package_env(), capture_output=True,
                          text=True)
    if proc.returncode:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise GrowlmError(f"lm-evaluation-harness could not list its tasks: {tail}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def registry_names() -> set[str]:
    """Every task, group and tag name of the installed harness's registry (cached per version)."""
    version = harness_version()
    cache = CACHE / f"lm_eval_tasks-{version}.json"
    try:
        return set(json.loads(cache.read_text()))
    except (OSError, json.JSONDecodeError):
        pass
    names = _ask(["registry"])["names"]
    try:
        write_json_atomic(cache, sorted(names))
    except OSError:
        pass
    return set(names)


def folder_problems(folder) -> list[str]:
    """Why a task folder cannot run: it is missing, holds no YAML, a YAML does not parse, or it
    defines no task (each YAML read with the harness's own loader, its `!function` tags unresolved)."""
    path = Path(folder)
    if not path.is_dir():
        return [f"{folder}: no such folder (a local task folder is given by its path, as lm-eval's --include_path "
                f"takes it)"]
    if not any(path.rglob("*.yaml")):
        return [f"{folder}: holds no task YAML (*.yaml)"]
    answer = _ask(["folder", str(path)])
    problems = [f"{folder}: {f} does not parse: {why}" for f, why in answer["broken"]]
    if not answer["tasks"] and not problems:
        problems.append(f"{folder}: its YAML files define no task (a task YAML has a `task:` name)")
    return problems


def task_problems(entries: list[str]) -> list[str]:
    """One line per entry of `evaluate.tasks` the harness cannot run (nothing for an empty list)."""
    if not entries:
        return []
    version = harness_version()
    if version is None:
        return [f"evaluate.tasks = {entries}: lm-evaluation-harness is not installed; install growlm's eval extra "
                f"(`.venv/bin/pip install -e '.[eval]'`; setup.sh does) or leave evaluate.tasks empty"]
    problems = []
    ids = [task_id(e) for e in entries]
    for dup in sorted({i for i in ids if ids.count(i) > 1}):
        problems.append(f"evaluate.tasks: two entries share the name {dup!r} (a folder's name is its results' name); "
                        f"rename one folder")
    registry = None
    for entry in entries:
        if entry in BUNDLED:
            continue
        if is_folder(entry):
            problems += [f"evaluate.tasks: {p}" for p in folder_problems(entry)]
            continue
        if registry is None:
            registry = registry_names()
        if entry not in registry:
            close = difflib.get_close_matches(entry, sorted(registry) + list(BUNDLED), n=3, cutoff=0.75)
            hint = f"; did you mean {' or '.join(close)}?" if close else ""
            problems.append(f"evaluate.tasks: {entry!r} is not a task of lm-evaluation-harness {version} nor growlm's "
                            f"own ({', '.join(BUNDLED)}), and no folder of that name exists{hint} (`lm-eval ls tasks` "
                            f"lists the harness's tasks)")
    return problems


# ----------------------------------------------------------------------------------------------
# growlm's cloze task: its data from the level's held-out text
# ----------------------------------------------------------------------------------------------

_EDGE = "\"'“”‘’()[]{}.,;:!?-—_*"


def cloze_examples(units, max_examples: int = CLOZE_MAX_EXAMPLES) -> list[dict]:
    """`{"context", "target"}` per unit of held-out text (one unit a line): the context is every word
    but the last, the target the last word without its punctuation. Units whose last word is not a
    plain word (a number, a lone dash) or that are shorter than CLOZE_MIN_WORDS are skipped. The
    harness puts one space between context and target (its target delimiter), as in the text."""
    out = []
    for unit in units:
        words = unit.split()
        if len(words) < CLOZE_MIN_WORDS:
            continue
        target = words[-1].strip(_EDGE)
        if not target.isalpha() or not words[-1].startswith(target[0]):  # the word must start the last token
            continue
        out.append({"context": " ".join(words[:-1]), "target": target})
        if len(out) >= max_examples:
            break
    return out


def write_cloze_task(template_dir, test_text, out_dir) -> int:
    """The bundled cloze task made runnable: its YAML from `template_dir` with its data file, written
    from the level's held-out text, beside it in `out_dir` (the YAML names the file by its path from
    the working folder, where every job runs). Returns the number of examples."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    lines = Path(test_text).read_text(encoding="utf-8").splitlines()
    examples = cloze_examples(lines)
    if not examples:
        raise GrowlmError(f"{test_text}: no held-out unit of {CLOZE_MIN_WORDS} or more words ends in a word; the cloze "
                          f"task needs some (a larger corpus.test_fraction gives more)")
    data = out_dir / "test.jsonl"
    data.write_text("".join(json.dumps(e, ensure_ascii=False) + "\n" for e in examples), encoding="utf-8")
    for template in sorted(Path(template_dir).glob("*.yaml")):
        config = yaml.safe_load(template.read_text())
        config.setdefault("dataset_kwargs", {})["data_files"] = {"test": str(data)}
        (out_dir / template.name).write_text(yaml.safe_dump(config, sort_keys=False))
    return len(examples)


# ----------------------------------------------------------------------------------------------
# the child process: `python -m growlm.tasks registry | folder PATH` prints one JSON line
# ----------------------------------------------------------------------------------------------

def _main(argv: list[str]) -> None:
    logging.disable(logging.WARNING)  # the harness warns about duplicate names while it indexes
    if argv[:1] == ["registry"]:
        from lm_eval.tasks import TaskManager  # optional dependency (the eval extra), in this child process only

        print(json.dumps({"names": TaskManager().all_tasks}))
    elif argv[:1] == ["folder"] and len(argv) == 2:
        from lm_eval.tasks import TaskManager  # optional dependency (the eval extra), in this child process only
        from lm_eval.tasks._yaml_loader import load_yaml  # optional dependency: the harness's own YAML loader

        broken = []
        for path in sorted(Path(argv[1]).rglob("*.yaml")):
            try:
                load_yaml(path, resolve_func=False, recursive=True)
            except Exception as err:  # noqa: BLE001 - any reason a YAML does not load is the user's to see
                broken.append([str(path.relative_to(argv[1])), str(err).splitlines()[0][:200]])
        tasks = TaskManager(include_path=argv[1], include_defaults=False).all_subtasks if not broken else []
        print(json.dumps({"tasks": tasks, "broken": broken}))
    else:
        sys.exit("usage: python -m growlm.tasks registry | folder PATH")


if __name__ == "__main__":
    _main(sys.argv[1:])
