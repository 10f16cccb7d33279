"""An experiment's results folder: where it lives, what made it, and whether what it holds is whole.

* **One folder per experiment.** `experiment: NAME` in the config; the default experiment
  (`default`) writes to `results/` as it always has, any other to `results/NAME/`, so the shipped
  overlays (`config/gpu.yaml` names itself `gpu`, ...) and a user's own write beside the default
  experiment, never over it. A name may not be one of the folders the default experiment writes
  directly under `results/` (`TOP_LEVEL`).
* **What made it.** A finished run records the experiment's settings in `<folder>/experiment.json`
  (`record`). When a later run of the same name changes settings that are not sweep values (a
  corpus setting, the tokenizer, a training stage), it rebuilds the folder in place; `drift` names
  those settings so that the run can say so in the terminal, with the way to keep both.
* **Whether it is whole**, checked while the Snakefile is parsed, before any job: every file a job
  recorded a sha256 for (token files, model weights, grown models) must still match it, and the
  tokenizer and growth records must still parse (`damaged_files`). A damaged input found by a job
  would come too late: Snakemake deletes the outputs of a job it reruns before the job starts, so a
  finished model whose input was altered would be gone before the job noticed. Digests are cached by
  (size, modification and change times, inode), so an unchanged file is hashed once.
* **Inputs known by content.** What comes from outside the workflow is known by a digest of its content
  (`content_digest`), not by its file date.

Torch-free (the Snakefile imports it).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from growlm.atomic import write_json_atomic
from growlm.errors import sha256
from growlm.growth_record import GROWTH_FILE

DEFAULT = "default"
# what the default experiment writes directly under results/: no other experiment may take these names
TOP_LEVEL = ("models", "checkpoints", "eval", "corpus", "tokens", "tokenizer", "report", "logs", "benchmarks",
             "profile", "plugins", "downloads", "live", "tasks")
RECORD = "experiment.json"
CACHE = ".growlm/verified.json"
# config keys that pick combinations of one experiment (a sweep) or say how jobs run, not what they compute
SWEEP_AND_HOW = ("d0", "L0", "d1", "L1", "n", "n_members", "methods", "seeds", "budgets", "lrs", "experiment",
                 "resources", "profile")
HOW_KEYS = {"train": ("threads", "compile", "compile_ramps", "sync_every", "log_to"), "corpus": ("threads",)}


def results_dir(name: str) -> str:
    """The experiment's folder, relative to the working folder."""
    return "results" if name == DEFAULT else f"results/{name}"


def name_problems(name: str) -> list[str]:
    if name != DEFAULT and name in TOP_LEVEL:
        return [f"experiment = {name!r}: the default experiment keeps its {name}/ folder directly under results/; "
                f"choose another name (e.g. {name}_run)"]
    return []


# ----------------------------------------------------------------------------------------------
# what made it
# ----------------------------------------------------------------------------------------------

def identity(config: dict) -> dict:
    """The settings that make an experiment what it is: everything but its sweep values and how its
    jobs run."""
    out = {k: v for k, v in config.items() if k not in SWEEP_AND_HOW}
    for section, keys in HOW_KEYS.items():
        if isinstance(out.get(section), dict):
            out[section] = {k: v for k, v in out[section].items() if k not in keys}
    return json.loads(json.dumps(out, sort_keys=True, default=str))


def _differences(old, new, prefix: str = "") -> list[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        keys = sorted(set(old) | set(new))
        return [d for k in keys for d in _differences(old.get(k), new.get(k), f"{prefix}.{k}" if prefix else k)]
    return [] if old == new else [prefix or "(the config)"]


def record(folder: str | Path, config: dict, configfiles: list[str], made: list[str] | None = None) -> None:
    """Write what made this folder's results (after a successful run), and which outputs it made (`made`:
    the kept outputs, so that a later run says "gone" only of what existed)."""
    path = Path(folder) / RECORD
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"experiment": config["experiment"], "configfiles": [str(f) for f in configfiles],
                                "settings": identity(config), "made": sorted(made or [])}, indent=1, sort_keys=True))


def gone(folder: str | Path, outputs: list[str]) -> list[str]:
    """The `outputs` that the folder's last finished run made (`record`) and that are missing now; not the
    outputs of a method, size or seed added since, which were never made."""
    try:
        made = set(json.loads((Path(folder) / RECORD).read_text()).get("made") or [])
    except (OSError, json.JSONDecodeError):
        made = set()
    return [p for p in missing(outputs) if p in made or (not made and Path(f"{p}.sha256").is_file())]


def drift(folder: str | Path, config: dict) -> tuple[list[str], list[str]]:
    """(the settings that differ from those that made the folder's results, the config files that made
    them); nothing when the folder holds no finished run."""
    path = Path(folder) / RECORD
    try:
        old = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return [], []
    return _differences(old.get("settings"), identity(config)), old.get("configfiles", [])


# ----------------------------------------------------------------------------------------------
# whether it is whole
# ----------------------------------------------------------------------------------------------

def _stamp(st: os.stat_result) -> list[int]:
    """What says a file is unchanged without reading it: size, modification and change times, inode. The
    change time (ctime) is set by the system on every write and cannot be set back (`cp -p`, `rsync -a`,
    `tar` and `touch -d` restore the modification time only), so a file put back with an old date is
    hashed again, never taken for the one hashed before."""
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def _cached_digest(path: Path, cache: dict) -> str:
    stamp = _stamp(path.stat())
    key = str(path)
    hit = cache.get(key)
    if hit and hit[:-1] == stamp:
        return hit[-1]
    digest = sha256(path)
    cache[key] = [*stamp, digest]
    return digest


def _save_cache(cache_path: Path, cache: dict) -> None:
    try:
        write_json_atomic(cache_path, cache)
    except OSError:
        pass


def content_digest(paths, folder: str | Path) -> str:
    """One sha256 of files that come from outside the workflow (a member's folder, a local corpus file,
    a task folder, a plugin file): their names and contents, in order. A rule passes it as a param and
    marks the files `ancient` (`rules/inputs.smk`), so that a change of content reruns the jobs that read
    them whatever the file dates say, and a file copied or touched without a change reruns nothing.
    Each file's digest is cached in `folder`'s cache by `_stamp`, so an unchanged file is read once."""
    cache_path = Path(folder) / CACHE
    try:
        cache = json.loads(cache_path.read_text())
    except (OSError, json.JSONDecodeError):
        cache = {}
    before = dict(cache)
    h = hashlib.sha256()
    for p in paths:
        p = Path(p)
        h.update(f"{p.name}\0".encode())
        h.update((_cached_digest(p, cache) if p.is_file() else "missing").encode())
    if cache != before:
        _save_cache(cache_path, cache)
    return h.hexdigest()


# the files whose writers always record their sha256 beside them (errors.record_sha256), by kind: a file of a
# kind whose other files have their records, and that has none, has lost it (a folder made before a kind was
# recorded has no record of that kind at all, and is taken as it is)
RECORDED = {"token files": ("tokens", "**/*.npy"), "corpus levels": ("corpus", "level*/*"),
            "prepared sources": ("corpus", "sources/*/*"), "model weights": ("models", "**/model.safetensors"),
            "grown models": ("models", "**/growlm_grown.safetensors")}


def _unrecorded(folder: Path) -> list[str]:
    """The files of a RECORDED kind that have no `.sha256` beside them while others of their kind have:
    their content cannot be checked, and a file changed with its record removed would pass for a new
    input (Snakemake sees only its date). A cooldown branch's state (`<model>/branches/b<point>/state/`) is a
    checkpoint, checked by its own manifest when its branch reads it: not a recorded file."""
    out = []
    for sub, pattern in RECORDED.values():
        files = [f for f in sorted((folder / sub).glob(pattern)) if f.is_file() and f.suffix != ".sha256"
                 and not (f.parent.name == "state" and "branches" in f.parts)]
        kept = [Path(f"{f}.sha256").is_file() for f in files]
        if any(kept):
            out += [str(f) for f, k in zip(files, kept) if not k]
    return out


def finished_folder(path: Path) -> bool:
    """Whether the model folder holding `path` was finished by its job: its declared weights
    (model.safetensors; a grown model's growth.json) are there. A job that failed (a full disk) leaves
    files it had not declared, such as a half-written tokenizer.json; Snakemake removes the declared
    ones, and the job's rerun writes the folder anew, so those leftovers are not damage."""
    folder = path.parent
    return (folder / GROWTH_FILE).is_file() if "grown" in folder.parts else (folder / "model.safetensors").is_file()


def damaged_files(folder: str | Path) -> list[tuple[str, str]]:
    """[(file, what is wrong)] for the experiment's recorded files that are no longer what was written
    (a sha256 that differs from the one recorded beside the file, or a record that is gone: `_unrecorded`)
    and its tokenizer and growth records that no longer parse (in a model folder, only once its job
    finished it: `finished_folder`). A recorded file that is gone is not damaged but missing (`missing`)."""
    folder = Path(folder)
    cache_path = folder / CACHE
    try:
        cache = json.loads(cache_path.read_text())
    except (OSError, json.JSONDecodeError):
        cache = {}
    problems = [(path, "its sha256 record (.sha256 beside it) is gone, so its content cannot be checked")
                for path in _unrecorded(folder)]
    for sub in ("corpus", "tokens", "tokenizer", "models"):
        base = folder / sub
        if not base.is_dir():
            continue
        for rec in sorted(base.rglob("*.sha256")):
            path = rec.with_suffix("")
            if not path.is_file():
                continue
            try:
                if _cached_digest(path, cache) != rec.read_text().strip():
                    problems.append((str(path), "its content differs from the sha256 recorded when it was written"))
            except OSError as err:
                problems.append((str(path), f"unreadable: {err}"))
        for name in ("tokenizer.json", GROWTH_FILE):
            for path in sorted(base.rglob(name)):
                if sub == "models" and not finished_folder(path):
                    continue
                try:
                    json.loads(path.read_text())
                except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
                    problems.append((str(path), f"not valid JSON: {err}"))
    if cache:
        _save_cache(cache_path, cache)
    return problems


def missing(paths) -> list[str]:
    return [str(p) for p in paths if not os.path.exists(p)]
