"""Compile once: no refinement recompiles while its model changes from step to step.

Every growth operator whose model changes per step (growth masks, cross-member factors, grouped
norms: msg, msg_members, concat, concat followed by a depth operator), in both families, is refined
through its whole ramp by the real training loop with `compile: true` and dynamo's
`error_on_recompile` (growlm.compile_check, which traces with dynamo's eager backend: the
recompilations are decided by dynamo's guards before any backend runs). So are the V-cycle's
stages (several models of different shapes in one process) and the teaching refiner (a weight that
decays per step, then the plain loss). A model that reads a Python float in its forward, as a
plugin might, is named by the check with dynamo's reason. One test compiles with inductor for real.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch import nn

from growlm import train as training
from growlm.compile_check import check_compiles_once
from growlm.errors import GrowlmError
from growlm.growth import grow
from growlm.model import build_model
from growlm.schedules.vcycle import coalesce
from growlm.train_config import TrainConfig

V, T = 64, 16


def members(n: int, d: int, L: int, family: str = "gpt2") -> list[nn.Module]:
    extra = {"family": family, "n_kv_head": 1} if family == "llama" else {}
    return [build_model(seed=10 + i, n_embd=d, n_layer=L, vocab_size=V, n_positions=T, head_dim=8, **extra)
            for i in range(n)]


RAMPED = [
    # (chain, options, depth of M'_1), grown from two members 16 x 1 into width 32
    ("msg", {"ramp_steps": 3}, 2),
    ("msg_members", {"ramp_steps": 3}, 2),
    ("concat", {"ramp_steps": 3, "ln_ramp_steps": 4, "cross": "random"}, 1),
    ("concat", {"ramp_steps": 2, "ln_ramp_steps": 3, "cross": "zero"}, 1),
    (["concat", "zero_block"], {"ramp_steps": 3, "ln_ramp_steps": 3, "cross": "random"}, 2),
]


@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.parametrize("chain, options, depth", RAMPED, ids=lambda v: "+".join(v) if isinstance(v, list) else None)
def test_refinement_through_the_ramp_compiles_once(chain, options, depth, family):
    grown = grow(members(2, 16, 1, family), chain, n_embd=32, n_layer=depth, seed=0, **options)
    assert hasattr(grown, "growth_step") and not grown.ramp_done
    steps = check_compiles_once(grown, "+".join(chain) if isinstance(chain, list) else chain)
    assert grown.ramp_done and steps >= max(options.get("ramp_steps", 0), options.get("ln_ramp_steps", 0)) + 1


def test_the_ramp_reaches_the_model_as_a_tensor_and_changes_nothing_else():
    """The masked forward reads the ramp only from its buffer: at every step of the ramp it equals
    the forward computed with the ramps' Python floats (the arithmetic before compile-once), and the
    buffer is not part of the state dict."""
    grown = grow(members(2, 16, 1), "concat", n_embd=32, n_layer=1, seed=0, ramp_steps=4, ln_ramp_steps=5,
                 cross="random")
    x = torch.randint(0, V, (2, T), generator=torch.Generator().manual_seed(0))
    assert "ramp_values" not in grown.state_dict()
    outs = []
    for step in range(6):
        grown.growth_step(step)
        assert grown.ramp_values[0].item() == pytest.approx(grown.c_mask)
        with torch.no_grad():
            outs.append(grown.masked_forward(x).logits)
    assert not torch.equal(outs[0], outs[2]) and grown.ramp_done
    with torch.no_grad():  # at the end of the ramps the masked forward is the plain model's, as before
        assert torch.allclose(outs[-1], grown.inner(input_ids=x).logits, atol=1e-5)
    assert grown.stepping_module is grown.inner


class FloatRamp(nn.Module):
    """What a plugin might write: a ramp kept as a Python float and read in forward."""

    def __init__(self, inner: nn.Module, ramp_steps: int = 3):
        super().__init__()
        self.inner, self.spec, self.c = inner, {"ramp_steps": ramp_steps}, 0.0

    @property
    def config(self):
        return self.inner.config

    def growth_step(self, step: int) -> None:
        self.c = min(1.0, step / self.spec["ramp_steps"])

    def forward(self, input_ids, **kw):
        out = self.inner(input_ids=input_ids)
        out.logits = out.logits * (0.5 + 0.5 * self.c)
        return out


def test_a_model_that_reads_a_python_float_per_step_is_named():
    with pytest.raises(GrowlmError, match=r"'my_ramp' recompiles under torch.compile.*self.c == 0.0.*as a tensor"):
        check_compiles_once(FloatRamp(members(1, 16, 1)[0]), "plugin operator 'my_ramp'")


def test_vcycle_stages_each_compile_once():
    """The V-cycle trains models of several shapes in one process, one training run each (its stages):
    each run compiles its own model once, nothing recompiles across them."""
    large = members(1, 32, 2)[0]
    coarse = coalesce(copy.deepcopy(large), factor=2)
    for stage in (large, coarse, large):
        check_compiles_once(stage, "the V-cycle's stages", steps=3)


def test_teaching_compiles_once(tmp_path):
    """The teaching refiner's weight decays per step (outside the model) and its loss gives way to the
    plain loss: the student runs the same compiled module throughout."""
    teacher = members(1, 16, 1)[0]
    teacher.save_pretrained(tmp_path / "m1")
    grown = grow(members(1, 16, 1), "msg", n_embd=32, n_layer=2, seed=0, ramp_steps=3)
    teach = {"teach_weight": 0.5, "temperature": 2.0, "teach_steps": 2, "teachers": [str(tmp_path / "m1")]}
    check_compiles_once(grown, "msg with teach", refiners={"teach": teach})


@pytest.mark.parametrize("compile_ramps, graphs", [(True, 2), (False, 1)])
def test_inductor_compiles_each_structure_once_and_counts_compile_time(tmp_path, compile_ramps, graphs):
    """The real compiler (inductor) through msg's whole ramp: with `compile_ramps`, two compilations (the
    masked model and, after the ramp, the plain one); without (the default), the ramp's steps run eagerly,
    the very losses of an eager run, and only the plain model compiles; none more either way. The
    ledger's compile_s holds their time, apart from the training steps (the comparison's wall ratios
    leave it out)."""
    import pandas as pd
    import torch._dynamo
    from torch._dynamo.utils import counters

    tokens = np.random.default_rng(0).integers(0, V, 20000).astype(np.uint16)
    ledgers = {}
    for compile in (False, True):
        grown = grow(members(1, 16, 1), "msg", n_embd=32, n_layer=2, seed=0, ramp_steps=2)
        cfg = TrainConfig(tokens=6 * 2 * T, batch_size=2, context=T, lr=1e-4, warmup_steps=1, eval_interval=3,
                          eval_tokens=2 * T, checkpoint_every=1000, dense_log_steps=6, compile=compile,
                          compile_ramps=compile_ramps)
        torch._dynamo.reset()
        counters.clear()
        with torch._dynamo.config.patch(error_on_recompile=True):
            training.train(grown, tokens, tokens[:2000], cfg, ckpt_dir=tmp_path / f"ckpt{compile}",
                           ledger_path=tmp_path / f"l{compile}.csv", log=lambda *a: None)
        torch._dynamo.reset()
        assert grown.ramp_done
        ledgers[compile] = pd.read_csv(tmp_path / f"l{compile}.csv").set_index("step")
    assert counters["stats"]["unique_graphs"] == graphs, dict(counters["stats"])
    ramp = [1, 2]  # the losses of steps 0 and 1: the masked model's (growth_step(2) ends the ramp)
    eager, compiled = ledgers[False].loc[ramp, "train_loss"], ledgers[True].loc[ramp, "train_loss"]
    if compile_ramps:
        assert np.allclose(compiled, eager, rtol=1e-4)
    else:
        assert compiled.tolist() == eager.tolist()
    last = ledgers[True].iloc[-1]
    assert 0 < last["compile_s"] < last["wall_s"] and ledgers[False].iloc[-1]["compile_s"] == 0
