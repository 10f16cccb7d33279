"""The benchmark tasks' table (rule report_tasks): one row per model, task and metric of the
lm-evaluation-harness records, with the model's arm, sweep values and training FLOPs, an M_1's members
and growth included (`growlm.compare`'s pricing)."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pandas as pd

from growlm.compare import growth_cost, priced, read_ledger
from growlm.errors import read_json
from growlm.growth_record import Growth
from growlm.task_scores import metric_label, read_task_records


def _final_flops(model_dir, pretrained: dict | None = None) -> float:
    """A model's training FLOPs: its ledger's last row; a member growlm did not train (members.pretrained)
    has no ledger: its stated cost (`priced`), or NaN (unknown)."""
    ledger = Path(model_dir) / "ledger.csv"
    if not ledger.is_file() and (Path(model_dir) / "growlm.json").is_file():
        meta = read_json(Path(model_dir) / "growlm.json")
        flops = (meta.get("train") or {}).get("flops")
        if meta.get("role") == "pretrained member":
            flops = priced({"dir": str(model_dir), "pretrained": True}, pretrained)["flops"]
        return math.nan if flops is None else float(flops)
    return float(read_ledger(ledger)["flops"].iloc[-1])


def task_models(combos: list[dict], paths: dict) -> dict[str, dict]:
    """Every model of the sweep by folder: its arm, the sweep values it depends on, and its training
    FLOPs with everything it was made from (an M_1's members and growth included, as its curve
    starts there; a member's own; M_0's)."""
    models: dict[str, dict] = {}
    for c in combos:
        n = int(c["n"])
        for i in range(1, n + 1):
            d = os.path.normpath(paths["small"].format(member=i, **c))
            models.setdefault(d, {"arm": f"member m_{i}", "kind": "member", "method": "", "d0": c["d0"],
                                  "L0": c["L0"], "d1": "", "L1": "", "n": "", "seed": c["seed"], "budget": "",
                                  "lr": "", "dir": d})
        d = os.path.normpath(paths["baseline"].format(**c))
        models.setdefault(d, {"arm": "M_0 (scratch)", "kind": "M_0", "method": "scratch", "d0": "", "L0": "",
                              "d1": c["d1"], "L1": c["L1"], "n": "", "seed": c["seed"], "budget": c["budget"],
                              "lr": c["lr"], "dir": d})
        d = os.path.normpath(paths["refined"].format(**c))
        models.setdefault(d, {"arm": f"M_1 ({c['method']})", "kind": "M_1", "method": c["method"], "d0": c["d0"],
                              "L0": c["L0"], "d1": c["d1"], "L1": c["L1"], "n": n, "seed": c["seed"],
                              "budget": c["budget"], "lr": c["lr"], "dir": d,
                              "grown": os.path.normpath(paths["grown"].format(**c))})
    return models


def task_table(combos: list[dict], paths: dict, task_files, pretrained: dict | None = None) -> pd.DataFrame:
    """One row per model x task x metric of the lm-evaluation-harness records, with the model's arm,
    sweep values and training FLOPs (`task_models`; pretrained members priced by `priced`): `value`,
    `stderr`, `higher_is_better`, `samples`, `named` (the task its entry named, or one of a folder's;
    false for a group's subtasks) and `error` (a failed run: one row, naming the task entry and the error)."""
    tasks = read_task_records(task_files)
    models = task_models(combos, paths)
    rows = []
    for d, records in sorted(tasks.items()):
        info = models.get(d, {"arm": d, "kind": "", "method": "", "dir": d})
        flops = _final_flops(d, pretrained)
        if info.get("grown"):
            cost = growth_cost(Growth.read(info["grown"]), pretrained)
            flops += (0.0 if cost["unknown"] else cost["small_flops"]) + cost["growth_flops"]  # members unknown: free
        base = {k: v for k, v in info.items() if k != "grown"} | {"training_flops": flops}
        for record in records:
            if record.get("error"):
                rows.append({**base, "entry": record["task"], "task": record["task"], "metric": "", "value": math.nan,
                             "stderr": math.nan, "higher_is_better": "", "samples": "", "named": True,
                             "error": record["error"]})
                continue
            scores = record.get("scores") or {}
            named = {t for t in record.get("tasks") or [] if scores.get(t)} or set(scores)
            for task, metrics in sorted(scores.items()):
                for key, value in metrics.items():
                    metric = metric_label(key)
                    stderr = (record.get("stderr") or {}).get(task, {}).get(key)
                    better = (record.get("higher_is_better") or {}).get(task, {}).get(key.partition(",")[0], "")
                    rows.append({**base, "entry": record["task"], "task": task, "metric": metric,
                                 "value": math.nan if value is None else value,
                                 "stderr": math.nan if stderr is None else stderr, "higher_is_better": better,
                                 "samples": (record.get("samples") or {}).get(task, ""), "named": task in named,
                                 "error": ""})
    columns = ["arm", "kind", "method", "d0", "L0", "d1", "L1", "n", "seed", "budget", "lr", "training_flops", "entry",
               "task", "metric", "value", "stderr", "higher_is_better", "samples", "named", "error", "dir"]
    return pd.DataFrame(rows, columns=columns)
