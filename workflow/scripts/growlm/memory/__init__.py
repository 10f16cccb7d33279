"""The memory planner: how to train a model of a given size on the devices at hand.

* `growlm.memory.estimate`: the analytic estimate of a training step's peak memory, the `Plan`
  (micro-batch and accumulation, activation recomputation, precision, strategy), the ladder of
  settings from fastest to leanest and `next_smaller` (one rung down after an out-of-memory error);
* `growlm.memory.measure`: the short measured pre-run that corrects the estimate on a device, and
  `make_plan`, which puts the two together.

`growlm.runner` runs training under a plan and re-plans after an out-of-memory error.
"""
