"""Jobs of the evaluation stage: held-out metrics of a model, of the members' ensemble, its scores on
lm-evaluation-harness tasks (`growlm.harness`, with growlm's own cloze task written from the test
split by `cloze_task`). The comparison of M_0 with every M_1 is `growlm.jobs.compare`: it reads their files
and needs no torch."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from growlm.devices import choose_device
from growlm.harness import run_task
from growlm.console import log, warn
from growlm.loss import evaluate
from growlm.model import LogitEnsemble, load_model
from growlm.tasks import write_cloze_task
from growlm.tokens import load_tokens


def _evaluate(model: torch.nn.Module, name: str, test_files: dict, context: int, max_tokens: int, out_file) -> dict:
    device = choose_device()
    model = model.to(device)
    result = {"model": name, "levels": {}}
    for level, f in sorted(test_files.items()):
        result["levels"][str(level)] = evaluate(model, load_tokens(f), context=context, batch_size=16,
                                                max_tokens=max_tokens, device=device)
    Path(out_file).parent.mkdir(parents=True, exist_ok=True)
    Path(out_file).write_text(json.dumps(result, indent=2))
    log(f"evaluated {name}: {json.dumps(result['levels'])}")
    return result


def evaluate_model(*, model_dir, test_files: dict, context: int, max_tokens: int, out_file) -> dict:
    """Held-out loss, perplexity and next-token accuracy on each level's test split."""
    return _evaluate(load_model(model_dir), str(model_dir), test_files, context, max_tokens, out_file)


def evaluate_ensemble(*, member_dirs: list[str], test_files: dict, context: int, max_tokens: int, out_file) -> dict:
    """The same metrics for the untrained logit-average ensemble of the members."""
    ensemble = LogitEnsemble([load_model(d) for d in member_dirs])
    return _evaluate(ensemble, f"ensemble of {len(member_dirs)}", test_files, context, max_tokens, out_file)


def cloze_task(*, template_dir, test_text, out_dir) -> None:
    """growlm's cloze task, runnable: its YAML and its data, written from the level's held-out text."""
    n = write_cloze_task(template_dir, test_text, out_dir)
    log(f"cloze task: {n} examples from {test_text} in {out_dir}")


def evaluate_tasks(*, model_dir, spec: dict, limit: int | None, out_file) -> dict:
    """The model's scores on one entry of `evaluate.tasks`; a failed run is written as the record's
    `error` (and said in the terminal), so that every other result stays in place."""
    record = run_task(model_dir, spec, device=choose_device(), limit=limit, log=log)
    Path(out_file).parent.mkdir(parents=True, exist_ok=True)
    Path(out_file).write_text(json.dumps(record, indent=2))
    if record["error"]:
        warn(f"task {spec['id']} failed on {model_dir}: {record['error']} (recorded in {out_file}; the report "
             f"lists it; the other results stand)")
    else:
        log(f"{spec['id']} on {model_dir}: {json.dumps(record['scores'])}")
    return record
