"""Training schedules that stand in the method list but reuse no small model: the controls.

* `growlm.schedules.vcycle`: the Multi-Level V-cycle (coalesce M_0's initialisation, train it small,
  de-coalesce, interpolate);
* `growlm.schedules.apollo`: an Apollo-style progressive schedule (shared layers, sampled depth,
  growing stages) from M_0's initialisation.

Both count their training FLOPs as the growth cost; the refinement then trains their result like
any grown M'_1.
"""
