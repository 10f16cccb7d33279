"""One lm-evaluation-harness task (or folder of tasks) on one saved model, through the harness's API.

A growlm model folder is a `save_pretrained` folder with its tokenizer, which the harness's `hf`
backend loads with `AutoModelForCausalLM` as it loads any Hub model: nothing here depends on the
model family. The run is fixed: the harness's default seeds, given explicitly (`SEEDS`), zero-shot
unless the task says otherwise, and the same examples for every model (`limit` takes the first ones).

The batch: on a GPU the harness's own search ("auto": the largest batch that fits, found by halving
after an out-of-memory error, up to `MAX_GPU_BATCH`); on a CPU a fixed `CPU_BATCH`, where a larger one
gains nothing. The scores do not depend on it.

Any failure of the run (a task whose data cannot be read, a model the backend cannot load) is kept
as the record's `error`, so that one failing task leaves every other result in place and the report
names the task and the model; the job itself succeeds.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import time
import traceback

SEEDS = {"random_seed": 0, "numpy_random_seed": 1234, "torch_random_seed": 1234, "fewshot_random_seed": 1234}
CPU_BATCH = 16
MAX_GPU_BATCH = 256
BOOTSTRAP_ITERS = 1000  # standard errors of the non-mean metrics (perplexity); the harness's 100,000 take minutes


def folder_tasks(folder) -> list[str]:
    """Every task (not group or tag) the YAMLs of `folder` define."""
    from lm_eval.tasks import TaskManager  # optional dependency (the eval extra)

    return TaskManager(include_path=str(folder), include_defaults=False).all_subtasks


def _clean(value):
    """A metric value as JSON holds it: a float, or None for the harness's 'N/A'."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def fetch_task_data(spec: dict, log=print) -> dict:
    """Build the tasks of `spec` (`growlm.tasks.task_specs`) as lm-evaluation-harness does before it runs
    them: each task loads its documents (`datasets.load_dataset`, through the Hub's cache), so that an
    evaluation job later finds them without a network (the workflow's `prepare` target). Returns
    `{"task", "tasks": {name: documents per split}}`; an error raises (it is what prepare is for)."""
    from lm_eval.tasks import TaskManager, get_task_dict  # optional dependency (the eval extra)

    logging.getLogger("lm_eval").setLevel(logging.WARNING)
    names = [spec["name"]] if spec.get("name") else folder_tasks(spec["folder"])
    manager = TaskManager(include_path=spec["folder"]) if spec.get("folder") else TaskManager()
    built = {}

    def walk(d):
        for key, task in d.items():
            if isinstance(task, dict):
                walk(task)
            elif task is not None:
                name = getattr(key, "group_name", None) or getattr(task, "config", None) and task.config.task or str(key)
                docs = {}
                for split in ("training", "validation", "test", "fewshot"):
                    has, get = getattr(task, f"has_{split}_docs", None), getattr(task, f"{split}_docs", None)
                    if split != "fewshot" and has is not None and has():
                        docs[split] = len(get())
                built[str(name)] = docs

    walk(get_task_dict(names, manager))
    log(f"{spec['id']}: data of {len(built)} task(s) ready: " + ", ".join(f"{k} {v}" for k, v in built.items()))
    return {"task": spec["id"], "tasks": built}


def run_task(model_dir, spec: dict, *, device: str, limit: int | None = None, log=print) -> dict:
    """Run `spec` (`growlm.tasks.task_specs`: a registry task, or a folder's tasks) on the model in
    `model_dir`; returns the record `{"task", "tasks", "scores", "stderr", "higher_is_better",
    "samples", "settings", "error"}`, `scores[task][metric]` a float (metric names as the harness
    writes them: 'acc,none')."""
    record = {"task": spec["id"], "model": str(model_dir), "tasks": [], "scores": {}, "stderr": {},
              "higher_is_better": {}, "samples": {}, "error": None}
    batch = "auto" if device.startswith("cuda") else CPU_BATCH
    try:
        version = importlib.metadata.version("lm_eval")
    except importlib.metadata.PackageNotFoundError:
        version = None
    record["settings"] = {"lm_eval": version, "device": device, "batch_size": batch, "limit": limit, **SEEDS,
                          "bootstrap_iters": BOOTSTRAP_ITERS, "folder": spec.get("folder")}
    t0 = time.perf_counter()
    try:
        # The harness bootstraps the standard error of perplexity in a multiprocessing pool started by fork
        # unless DISABLE_MULTIPROC is set. A fork of a process that holds torch's threads can hang: the child
        # waits for ever on a lock held at the moment of the fork (seen in the tests, a one-in-a-few-runs
        # hang). 1000 resamples in this process take well under a second.
        os.environ.setdefault("DISABLE_MULTIPROC", "1")
        from lm_eval import simple_evaluate  # optional dependency (the eval extra)
        from lm_eval.models.huggingface import HFLM  # optional dependency (the eval extra)
        from lm_eval.tasks import TaskManager  # optional dependency (the eval extra)

        logging.getLogger("lm_eval").setLevel(logging.WARNING)
        names = [spec["name"]] if spec.get("name") else folder_tasks(spec["folder"])
        record["tasks"] = names
        manager = TaskManager(include_path=spec["folder"]) if spec.get("folder") else TaskManager()
        model = HFLM(pretrained=str(model_dir), device=device, batch_size=batch, max_batch_size=MAX_GPU_BATCH)
        log(f"{spec['id']}: {', '.join(names)} on {model_dir} ({device}, batch {batch}"
            f"{f', first {limit} examples' if limit else ''})")
        out = simple_evaluate(model=model, tasks=names, task_manager=manager, limit=limit, log_samples=False,
                              bootstrap_iters=BOOTSTRAP_ITERS, **SEEDS)
        for task, metrics in (out or {}).get("results", {}).items():
            for key, value in metrics.items():
                if key in ("alias", "name", "sample_len", "samples") or not isinstance(key, str) or "," not in key:
                    continue
                metric, _, filt = key.partition(",")
                what = "stderr" if metric.endswith("_stderr") else "scores"
                metric = metric.removesuffix("_stderr")
                record[what].setdefault(task, {})[f"{metric},{filt}"] = _clean(value)
        record["higher_is_better"] = (out or {}).get("higher_is_better", {})
        record["samples"] = {t: s.get("effective", s) if isinstance(s, dict) else s
                             for t, s in (out or {}).get("n-samples", {}).items()}
    except Exception as err:  # noqa: BLE001 - kept as the record's error: the other tasks' results stand
        record["error"] = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"[:500]
        log(f"{spec['id']} failed on {model_dir}: {record['error']}\n{traceback.format_exc()}")
    record["wall_s"] = round(time.perf_counter() - t0, 2)
    return record

