"""A growlm plugin: the members' weights averaged into one model of their size, then grown by msg.

Run it against M_0 and msg (docs/methods.md, "Your own method"):

    snakemake --cores 2 --config 'methods=[msg, average_then_grow]' \
        'grow={plugins: [examples/average_then_grow.py]}'
"""

import copy

import torch

from growlm.growth import grow, register_operator


@register_operator("average_then_grow", axis="both", exact=False, multi=True, ramps=("ramp_steps",))
def average_then_grow(models, *, n_embd, n_layer, n_head=None, seed=0, ramp_steps: int = 100):
    """The members' weights averaged (no alignment), then grown to n_embd x n_layer by msg.

    multi=True: it receives all n members (else only m_1). exact=False: the average of several
    networks does not compute what any of them computed. ramps: ramp_steps is a length in
    refinement steps (msg's masks), which growlm fits to the refinement unless grow.options sets it.
    """
    average = copy.deepcopy(models[0])
    with torch.no_grad():
        for name, p in average.named_parameters():
            p.copy_(sum(dict(m.named_parameters())[name] for m in models) / len(models))
    return grow([average], "msg", n_embd=n_embd, n_layer=n_layer, n_head=n_head, seed=seed,
                ramp_steps=ramp_steps)
