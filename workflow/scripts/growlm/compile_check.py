"""Does a model compile once? The check that a refinement never recompiles, for every operator.

torch.compile turns a module's forward into a graph with guards: the conditions under which the
graph still computes the forward (tensor shapes and dtypes, and the value of every Python number or
flag the forward reads). A Python float that changes from step to step - a growth mask's ramp, a
sampled depth, a refiner's weight - fails a guard at every step, and dynamo compiles the model again,
up to its recompile limit (8), after which the model runs uncompiled: the storm that made msg's
refinement on a GPU ten times slower than its baseline. growlm's own models pass such values as
tensors (`growlm.growth.masked`), and a training step runs a grown model's `stepping_module`
(itself during its ramps, its plain inner model after: each compiled once, `growlm.train.Run`; the
masked form only with `train.compile_ramps`, which the check turns on).

`check_compiles_once` runs the real training loop (`growlm.train.train`) on random tokens with
`compile: true` through a model's whole ramp, with dynamo's `error_on_recompile`, and names the first
recompilation with dynamo's own reason. It traces with the "eager" backend (dynamo's graphs and
guards without code generation: recompilations are decided before any backend runs, so what it
finds is what inductor would meet, in seconds instead of minutes). The tests run it for every growth
operator and schedule (`tests/test_compile.py`), and the check of `grow.plugins` before the first
job runs it for every plugin operator whose model changes per step.
"""

from __future__ import annotations

import contextlib
import tempfile

import numpy as np
import torch
import torch._dynamo

from growlm import train as training
from growlm.errors import GrowlmError
from growlm.train_config import TrainConfig


@contextlib.contextmanager
def _traced():
    """The training loop compiles with dynamo's eager backend, and a recompilation raises."""
    before = training.COMPILE_BACKEND
    training.COMPILE_BACKEND = "eager"
    try:
        with torch._dynamo.config.patch(error_on_recompile=True):
            yield
    finally:
        training.COMPILE_BACKEND = before
        torch._dynamo.reset()


def train_briefly(model: torch.nn.Module, steps: int, *, batch_size: int = 2, context: int | None = None,
                  compile: bool = False, compile_ramps: bool = False, refiners: dict | None = None) -> None:
    """`steps` steps of the real training loop (`growlm.train.train`) on random tokens, in a throwaway
    folder: what the checks before the first job run a model or a refiner through. In place."""
    config = model.config
    context = context or min(16, int(getattr(config, "n_positions", None) or config.max_position_embeddings))
    vocab = int(config.vocab_size)
    tokens = np.random.default_rng(0).integers(0, vocab, size=(steps + 2) * batch_size * context + 1)
    tokens = tokens.astype(np.uint16 if vocab < 2**16 else np.int32)
    cfg = TrainConfig(tokens=steps * batch_size * context, batch_size=batch_size, context=context, lr=1e-4,
                      warmup_steps=1, eval_interval=steps, eval_tokens=batch_size * context,
                      final_eval_tokens=batch_size * context,
                      checkpoint_every=10 ** 9, dense_log_steps=0, compile=compile, compile_ramps=compile_ramps,
                      refiners=refiners)
    with tempfile.TemporaryDirectory() as tmp:
        training.train(model, tokens, tokens[: 4 * batch_size * context], cfg, ckpt_dir=f"{tmp}/ckpt",
                       ledger_path=f"{tmp}/ledger.csv", log=lambda *a: None)


def check_compiles_once(model: torch.nn.Module, what: str, *, steps: int | None = None, batch_size: int = 2,
                        context: int | None = None, refiners: dict | None = None) -> int:
    """Train `model` (a grown model with `growth_step`, or any model) with `compile: true` and
    `compile_ramps: true` (a user may ask for both) for `steps` steps (default: its ramps plus two, so
    both its masked and its plain form run) on random tokens, and raise GrowlmError naming `what` and
    dynamo's reason at the first recompilation. Returns the steps run. The model is trained in place:
    pass a copy."""
    spec = getattr(model, "spec", {}) or {}
    ramp = max(int(spec.get("ramp_steps", 0) or 0), int(spec.get("ln_ramp_steps", 0) or 0))
    steps = steps or ramp + 2
    with _traced():
        try:
            train_briefly(model, steps, batch_size=batch_size, context=context, compile=True, compile_ramps=True,
                          refiners=refiners)
        except torch._dynamo.exc.RecompileError as err:
            reason = " ".join(str(err).split())
            raise GrowlmError(f"{what} recompiles under torch.compile during its refinement: {reason[:400]}. A value "
                              "that changes from step to step (a ramp, a weight, a depth) must reach the model as a "
                              "tensor (a buffer written in place), not as a Python number it reads in forward; see "
                              "growlm.growth.masked") from None
    return steps
