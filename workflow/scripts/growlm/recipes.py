"""Each method's refinement as its authors run it, expressed as shares of the run so that it carries to
any budget (torch-free: the Snakefile resolves a refine job's settings with it).

growlm refines every grown model with one common recipe (fresh AdamW, `train.refine.warmup_steps` of
warm-up to the large arms' peak rate, cosine decay over the budget). Where a method's paper prescribes
its own, `refine_recipe` puts it on top, and a user's settings in `grow.options.<method>` override it:

* `vcycle` (Multi-Level V-cycle): the large model's last stage trains `vcycle.final_share` of the
  budget (the authors: about half of the baseline's steps), restarting at the peak rate without
  warm-up. The V-cycle's earlier stages are its growth cost (`growlm.jobs.grow.vcycle`).
"""

from __future__ import annotations


def refine_recipe(config: dict, method: str, settings: dict) -> dict:
    """The refinement's `settings` (TrainConfig.run_settings) with `method`'s recipe applied."""
    out = dict(settings)
    if method == "vcycle":
        vc = config.get("vcycle") or {}
        out["tokens"] = max(1, int(round(float(vc.get("final_share", 0.5)) * int(settings["tokens"]))))
        out["warmup_steps"] = 0
    return out
