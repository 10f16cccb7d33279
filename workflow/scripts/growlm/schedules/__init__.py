"""Training schedules that stand in the method list but reuse no small model: the controls.

* `growlm.schedules.vcycle`: the Multi-Level V-cycle (coalesce M_0's initialisation, train it small,
  de-coalesce, interpolate);
* `growlm.schedules.apollo`: an Apollo-style progressive schedule (shared layers, sampled depth,
  growing stages) from M_0's initialisation.

Both count their training FLOPs as the growth cost; the refinement then trains their result like
any grown M'_1. Each is described in `growlm.methods.OPERATORS` (axis "schedule") and registers what runs
it in `RUNNERS` (`growlm.schedules.registry.runs`); importing this package registers the built-in ones.
"""

from growlm.schedules import apollo, vcycle  # noqa: F401 (each registers what runs it: `registry.runs`)
from growlm.schedules.registry import RUNNERS  # noqa: F401 (the grow job dispatches through it)
