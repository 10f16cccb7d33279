"""The lm-evaluation-harness records of the models (`growlm.harness.run_task` writes one per model and task
entry), read back: by model folder, and as one model's `{"<task>/<metric>": score}` columns of the comparison.
Torch-free; separate from `growlm.harness`, which runs the harness."""

from __future__ import annotations

import math
import os

from growlm.errors import read_json


def read_task_records(task_files) -> dict[str, list[dict]]:
    """The models' lm-evaluation-harness records (`growlm.harness.run_task`), by model folder."""
    out: dict[str, list[dict]] = {}
    for f in task_files or []:
        record = read_json(f)
        out.setdefault(os.path.normpath(record["model"]), []).append(record)
    return out


def metric_label(key: str) -> str:
    """The harness's 'acc,none' as 'acc'; a filtered metric keeps its filter ('exact_match_strict-match')."""
    metric, _, filt = key.partition(",")
    return metric if filt in ("", "none") else f"{metric}_{filt}"


def task_columns(records: list[dict]) -> dict[str, float]:
    """`{"<task>/<metric>": score}` of one model: the tasks each entry named (a folder's: all of
    its tasks; a group's own score where the harness aggregates it, else its subtasks')."""
    out = {}
    for record in records:
        scores = record.get("scores") or {}
        named = [t for t in record.get("tasks") or [] if scores.get(t)]
        for task in named or sorted(scores):
            for key, value in scores[task].items():
                out[f"{task}/{metric_label(key)}"] = math.nan if value is None else float(value)
    return out
