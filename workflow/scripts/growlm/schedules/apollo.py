"""A from-scratch progressive schedule in the manner of Apollo (Pan et al., 2024, "Preparing Lessons
for Progressive Training on Language Models"): the control that reuses no small model.

It answers "do the small models beat mere progressive training?". From M_0's own initialisation:

* shared layers: the L blocks of the full-depth model are views of k unique blocks (layer i runs
  unique block floor(i k / L)), so a stage with k unique blocks costs the parameters of k blocks;
* sampled depth: every step runs only the first D layers, with D drawn from {1..L} with probability
  proportional to 1/D ("low-value prioritised": mostly shallow, cheap steps, but every depth is
  trained, so the model works at any depth it is grown to);
* growing stages: k = 1, 2, 4, ... unique blocks; between stages every unique block is duplicated
  (interpolation: layer i keeps the same weights, so the function is unchanged when L is a power of
  two); after the last stage the blocks are unshared into a plain model of depth L.

`stages="authors"` (the default; the authors' GPT-2 script: 1, 3, 6 unique layers of 12 for 2, 2 and
6 epochs, the first quarter of a 40-epoch run, then the full model) runs the stages with fewer than L
unique blocks, each for a share of the schedule proportional to its block count, and leaves the full
depth to the refinement, which goes on at the peak rate without re-warm-up for the rest of the budget
(`growlm.recipes`). `stages="equal"` (growlm's first variant) runs k = 1, 2, ..., L for equal shares.

The schedule's FLOPs (each step at its sampled depth, `growlm.flops`) are counted as growth cost,
and the refinement then trains the result like any grown M'_1. A plain loop without checkpoints: a
killed schedule restarts from its beginning (it is short: `apollo.share` of the budget).
"""

from __future__ import annotations

import copy
import math
import time

import numpy as np
import torch
from growlm.console import log
from growlm.data import BatchSampler
from growlm.errors import GrowlmError
from growlm.families import family_of
from growlm.flops import shape_flops, train_flops_per_token
from growlm.loss import lm_loss
from growlm.model import build_model
from growlm.modes import run_mode
from growlm.schedules.registry import runs
from growlm.shape import ModelShape
from growlm.tokenizer import vocab_size
from growlm.tokens import load_tokens


def stage_widths(n_layer: int) -> list[int]:
    """Unique-block counts of the stages: 1, 2, 4, ... and finally n_layer."""
    ks, k = [], 1
    while k < n_layer:
        ks.append(k)
        k *= 2
    return ks + [n_layer]


def layer_map(n_layer: int, k: int) -> list[int]:
    return [i * k // n_layer for i in range(n_layer)]


def depth_probabilities(n_layer: int) -> np.ndarray:
    p = 1.0 / np.arange(1, n_layer + 1)
    return p / p.sum()


def _set_layers(model, unique: torch.nn.ModuleList, depth: int, n_layer: int | None = None) -> None:
    """The model's blocks: the first `depth` of the full depth's map onto the `unique` blocks."""
    full = layer_map(n_layer or ModelShape.of(model).L, len(unique))
    family_of(model).set_blocks(model, torch.nn.ModuleList([unique[j] for j in full[:depth]]))


def duplicate(unique: torch.nn.ModuleList, k_new: int, n_layer: int) -> torch.nn.ModuleList:
    """k_new unique blocks such that every layer of the full depth keeps its weights (exactly, when
    k_new is a multiple of len(unique) that divides n_layer's power-of-two steps)."""
    k_old = len(unique)
    src = [layer_map(n_layer, k_old)[min(n_layer - 1, (j * n_layer + k_new - 1) // k_new)] for j in range(k_new)]
    return torch.nn.ModuleList([copy.deepcopy(unique[s]) for s in src])


def stage_steps(n_layer: int, steps: int, stages: str = "authors") -> list[tuple[int, int]]:
    """(unique blocks, steps) of each stage of a schedule of `steps` steps (see the module docstring):
    "authors": the stages with fewer than n_layer unique blocks, lengths proportional to their block
    counts; "equal": every stage up to n_layer, equal lengths."""
    if stages not in ("authors", "equal"):
        raise GrowlmError(f"apollo.stages must be authors or equal, not {stages!r}")
    ks = stage_widths(n_layer)
    if stages == "equal":
        return [(k, steps // len(ks)) for k in ks]
    ks = ks[:-1] or [n_layer]  # a one-block model has no smaller stage
    counts = [steps * k // sum(ks) for k in ks]
    counts[-1] += steps - sum(counts)  # the rounding goes to the last stage
    return list(zip(ks, counts))


def apollo_schedule(init, train_tokens: np.ndarray, *, tokens: int, lr: float, batch_size: int,
                    context: int, seed: int, warmup_steps: int = 10, weight_decay: float = 0.1,
                    grad_clip: float = 1.0, stages: str = "authors", log=print) -> tuple:
    """Train `init` (M_0's initialisation, either family) with the progressive schedule for `tokens`
    tokens (`stages`: see `stage_steps`) and return a plain model of the same shape, with a summary
    (FLOPs, wall time, per-stage losses)."""
    shape = ModelShape.of(init)
    fam = family_of(init)
    L = shape.L
    plan = stage_steps(L, tokens // (batch_size * context), stages)
    if min(n for _, n in plan) < 1:
        raise GrowlmError(f"apollo: {tokens} tokens give fewer steps than the schedule's {len(plan)} stages need "
                          f"({', '.join(f'{k} block(s): {n}' for k, n in plan)}); a larger apollo.share or budget")
    cfg = init.config
    model = copy.deepcopy(init).train()
    unique = torch.nn.ModuleList([copy.deepcopy(fam.blocks(init)[0])])
    sampler = BatchSampler(train_tokens, batch_size=batch_size, context=context, seed=seed)
    rng = np.random.default_rng(seed)
    probs = depth_probabilities(L)
    flops, step, record = 0, 0, []
    warm = max(1, warmup_steps)  # "authors": one warm-up for the whole schedule; "equal": one per stage
    t0 = time.perf_counter()
    for s, (k, per_stage) in enumerate(plan):
        if len(unique) != k:
            unique = duplicate(unique, k, L)
        _set_layers(model, unique, L, L)  # the optimizer sees embeddings, ln_f and the k unique blocks
        params = list(dict.fromkeys(p for p in model.parameters()))  # shared modules appear once
        decay = [p for p in params if p.dim() >= 2]
        no_decay = [p for p in params if p.dim() < 2]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                                 {"params": no_decay, "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.95),
                                fused=True)
        losses, depths = [], []
        for i in range(per_stage):
            depth = int(rng.choice(np.arange(1, L + 1), p=probs))
            _set_layers(model, unique, depth, L)
            for g in opt.param_groups:
                g["lr"] = lr * min(1.0, ((i if stages == "equal" else step) + 1) / warm)
            x, y = sampler.batch(step)
            loss = lm_loss(model, x, y, logits=False)[0]
            if not math.isfinite(loss.item()):
                raise GrowlmError(f"apollo schedule: loss is {loss.item()} at stage {s + 1}, step {i + 1}")
            loss.backward()
            if grad_clip:
                torch.nn.utils.clip_grad_norm_(params, grad_clip)
            opt.step()
            opt.zero_grad(set_to_none=True)
            flops += batch_size * context * train_flops_per_token(context=context,
                                                                  **{**shape_flops(shape), "n_layer": depth})
            losses.append(loss.item())
            depths.append(depth)
            step += 1
        record.append({"stage": s + 1, "unique_blocks": k, "steps": per_stage, "mean_depth": float(np.mean(depths)),
                       "final_train_loss": float(np.mean(losses[-10:])),
                       # its own loop, eager on the CPU (growlm.modes: the comparison names it in M_1's)
                       "mode": run_mode("cpu", None, threads=torch.get_num_threads())})
        log(f"apollo stage {s + 1}/{len(plan)}: {k} unique block(s), {per_stage} steps, mean depth "
            f"{np.mean(depths):.2f}, train loss {record[-1]['final_train_loss']:.4f}")
    if len(unique) != L:  # the authors' stages stop below full depth: grown to it by the same map
        unique = duplicate(unique, L, L)
    # unshare: a plain model of depth L whose layer i is (a copy of) unique block i
    out = fam.model_class(cfg)
    _set_layers(model, unique, L, L)
    with torch.no_grad():
        out.load_state_dict(model.state_dict(), strict=False)
        for i, j in enumerate(layer_map(L, len(unique))):
            fam.blocks(out)[i].load_state_dict(unique[j].state_dict())
    out.tie_weights()
    summary = {"flops": int(flops), "wall_s": time.perf_counter() - t0, "steps": step,
               "tokens": step * batch_size * context, "stages": record}
    return out.eval(), summary


@runs("apollo")
def run(*, apollo: dict, model: dict, batch_size: int, context: int, weight_decay: float, grad_clip: float,
        seed: int, train_file, tokenizer_dir, val_file=None, out_dir=None):
    """The Apollo-style progressive control (`apollo_schedule` above; it reuses no small model): M_0's
    own initialisation trained with shared layers, sampled depth and growing stages for
    `apollo["tokens"]` tokens (the growth cost; `growlm.experiment.schedule_settings` resolves them, the
    rate and the warm-up from the config); refine trains on (growlm.recipes). It evaluates nothing
    (`val_file`) and leaves nothing beside the grown model (`out_dir`)."""
    init = build_model(seed=seed, vocab_size=vocab_size(tokenizer_dir), **model)
    grown, summary = apollo_schedule(init, load_tokens(train_file), tokens=int(apollo["tokens"]),
                                     lr=float(apollo["lr"]), batch_size=batch_size, context=context,
                                     seed=seed + 15485863, warmup_steps=int(apollo["warmup_steps"]),
                                     weight_decay=weight_decay, grad_clip=grad_clip,
                                     stages=apollo["stages"], log=log)
    log(f"Apollo schedule: {summary['steps']} steps in {len(summary['stages'])} stages, {summary['flops']:.3e} FLOPs")
    return grown, {"flops": summary["flops"], "wall_s": summary["wall_s"], "stages": summary["stages"]}
