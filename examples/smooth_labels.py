"""A growlm plugin refinement operator: label smoothing for the first steps of the refinement.

A grown model starts from its members' confident predictions; smoothing the targets for a while
asks it to unlearn that confidence gently while its new weights find their place. Put it in a
method's chain beside a growth operator and compare the two arms (docs: "Your own method"):

    snakemake --cores 2 --config 'methods=[msg, [msg, smooth_labels]]' \
        'grow={plugins: [examples/smooth_labels.py]}'
"""

import torch.nn.functional as F

from growlm.growth import register_operator
from growlm.refiners import Refiner


@register_operator("smooth_labels", axis="refine", ramps=("smooth_steps",))
class SmoothLabels(Refiner):
    """Cross entropy with smoothed targets (weight `smoothing`) for the first `smooth_steps` steps.

    ramps: smooth_steps is a length in refinement steps, which growlm sets to a share of the
    refinement unless grow.options sets it. The loss is computed from the same forward pass as the
    plain loss, so the refiner adds no FLOPs (flops() keeps its default, 0)."""

    def __init__(self, *, smooth_steps: int = 100, smoothing: float = 0.1):
        self.steps, self.smoothing = int(smooth_steps), float(smoothing)

    def loss(self, run, step, x, y):
        if step >= self.steps:
            return None  # the plain LM loss from here on
        logits = run.step_model(input_ids=x).logits.float()
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1), label_smoothing=self.smoothing)
