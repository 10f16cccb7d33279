"""The Multi-Level V-cycle (Zou, Zhang, Deng, ICLR 2024): a schedule that reuses no small model.

The authors' recipe, as their public GPT-2 example runs it (`example/scripts/multilevel_pretrain.sh`
and `map_tools/`), which growlm follows by default (`vcycle_plan`, `run`):

1. train the large model briefly (5% of the baseline's steps, all of it warm-up to the peak rate);
2. coalesce *those* weights into a model `factor` times narrower and shallower, merging head h with
   head h + H/k (and residual coordinate c with c + d/k) in width and layer i with layer i + L/k in
   depth (their GPT-2 config: `pairing="stride"`; `"adjacent"` merges neighbouring layers, 2i with
   2i + 1, as growlm did before);
3. train the coarse model with a fresh optimizer for about half of the baseline's steps, at 4x the
   large model's peak rate, without warm-up;
4. de-coalesce it (copies) and interpolate with the weights from before coalescing:
   theta = (1 - alpha) theta_stage1 + alpha decoalesce(theta_coarse), alpha = 0.5 for GPT-2. (Their
   script interpolates with the folder of the finished scratch baseline, which looks like a slip; the
   paper's figure says the weights before coalescing, which is what growlm uses.)
5. train the large model for about half of the baseline's steps, restarting at the peak rate without
   warm-up (in growlm: the refinement, with the V-cycle's recipe; `growlm.recipes`).

With more levels (`levels` > 2, a real V: d1 -> d1/2 -> d1/4 -> back up) every level above the
coarsest trains `stage_share` of the steps on the way down (the largest all warm-up), the coarsest
`coarse_share`, and every intermediate level `stage_share` again on the way up after its
interpolation; each level's peak rate is `lr_multiplier` times its parent's; every stage has a fresh
optimizer, and every stage's FLOPs are the growth cost.

The maps
--------
* `coalesce(model, factor=k, pairing=...)`: width by k: the residual coordinates, the heads (whole;
  under grouped-query attention whole key/value heads with their query heads, so the groups survive),
  the MLP units (a gated MLP's gate and up together) are merged in groups of k, {i, i + n/k, ...}.
  Depth by k: the blocks in groups of k (stride: {i, i + L/k, ...}; adjacent: {k i, ..., k i + k - 1}),
  each group averaged. Output axes (and
  biases, norm gains, embeddings) are AVERAGED over a group, input axes are SUMMED (a reader whose
  inputs were copies of one coordinate sees their sum); with a tied head the final norm is multiplied
  by k. The authors' code also scales
  GPT-2's embeddings by k after coalescing and by 1/k after de-coalescing (`embeddings="sum"`); growlm's
  default (`"mean"`) keeps de-coalescing in width exact.
* `decoalesce(model, factor=k, pairing=...)`: the normalised transpose, i.e. copies: width by tiling
  with the same pairing (exact: HyperCloning's algebra), depth by copying each block into its group
  (stride: the block list repeated, 1..L/k, 1..L/k, as G_stack; adjacent: 1,1,2,2,...; not exact in a
  pre-norm model). `coalesce(decoalesce(m))` returns m's weights exactly (a left inverse).
* `interpolate(before, coarse, alpha, ...)`: theta = (1 - alpha) theta_before + alpha decoalesce(theta_coarse)
  in the large model's shape; breaks symmetry and is not function-preserving on purpose.

Both families: RMSNorm gains are averaged and copied like LayerNorm's; key/value heads are merged in the
groups their query heads form; rotary positions act per head, whose size is kept.
"""

from __future__ import annotations

from pathlib import Path

import torch

from growlm.console import log
from growlm.devices import choose_device
from growlm.errors import GrowlmError
from growlm.growth.algebra import pack, state_dict_of, target_config, unpack
from growlm.model import build_model
from growlm.recipes import VCYCLE_STAGE_SCHEDULE
from growlm.runner import TrainingJob, run_job
from growlm.schedules.registry import runs
from growlm.shape import ModelShape
from growlm.tokenizer import vocab_size
from growlm.train_config import TrainConfig, compile_from_env

__all__ = ["coalesce", "decoalesce", "interpolate", "vcycle_plan", "PAIRINGS"]
PAIRINGS = ("stride", "adjacent")


def _factor(big: int, small: int, what: str) -> int:
    if small <= 0 or big % small:
        raise GrowlmError(f"{what} {big} is not a multiple of {small}")
    return big // small


def groups(n: int, k: int, pairing: str, chunk: int = 1) -> torch.Tensor:
    """(n / k, k) indices: row j lists the k units of size `chunk` merged into coarse unit j.
    stride: unit j with j + n/k, j + 2n/k, ...; adjacent: units k j .. k j + k - 1."""
    if pairing not in PAIRINGS:
        raise GrowlmError(f"vcycle pairing must be one of {', '.join(PAIRINGS)}, not {pairing!r}")
    units = n // chunk
    if units % k:
        raise GrowlmError(f"{units} units cannot be merged in groups of {k}")
    j = torch.arange(units // k)
    g = j[:, None] + (units // k) * torch.arange(k)[None, :] if pairing == "stride" else j[:, None] * k + torch.arange(k)
    e = torch.arange(chunk)
    return (g[:, :, None] * chunk + e[None, None, :]).permute(0, 2, 1).reshape(-1, k)  # (coarse units, k)


def _merge_out(W: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """Average the columns of each group (an output axis)."""
    return W[..., g].mean(-1)


def _merge_in(W: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """Sum the rows of each group (an input axis)."""
    return W[g].sum(1)


def _axes(s: ModelShape, k: int) -> dict:
    """The groups of every width axis, stride-paired as in the authors' GPT-2 code and growlm's before:
    residual coordinates, query channels (whole heads, grouped as their key/value heads are), key/value
    channels, MLP units."""
    res = groups(s.d, k, "stride", chunk=s.dh)
    kv_heads = groups(s.g, k, "stride")  # (g/k, k) key/value heads merged
    qh = (kv_heads[:, None, :] * s.r + torch.arange(s.r)[None, :, None]).reshape(-1, k)  # their query heads
    e = torch.arange(s.dh)
    qc = (qh[:, None, :] * s.dh + e[None, :, None]).reshape(-1, k)
    kvc = (kv_heads[:, None, :] * s.dh + e[None, :, None]).reshape(-1, k)
    return {"res": res, "qc": qc, "kvc": kvc, "mlp": groups(s.f, k, "stride")}


# (input axis, output axis) of every block tensor of the weight form; None: no input axis (a vector)
_ROLES = {"ln1_w": (None, "res"), "ln1_b": (None, "res"), "ln2_w": (None, "res"), "ln2_b": (None, "res"),
          "q_w": ("res", "qc"), "q_b": (None, "qc"), "k_w": ("res", "kvc"), "k_b": (None, "kvc"),
          "v_w": ("res", "kvc"), "v_b": (None, "kvc"), "o_w": ("qc", "res"), "o_b": (None, "res"),
          "fc_w": ("res", "mlp"), "fc_b": (None, "mlp"), "gate_w": ("res", "mlp"), "gate_b": (None, "mlp"),
          "pr_w": ("mlp", "res"), "pr_b": (None, "res")}


def coalesce(model, *, factor: int = 2, pairing: str = "stride", embeddings: str = "mean", n_embd: int | None = None,
             n_layer: int | None = None):
    """The model `factor` times narrower and shallower (see the module docstring). `n_embd`/`n_layer`
    may be given instead of `factor` (they must divide by the same factor in width; depth by its own)."""
    s = ModelShape.of(model)
    k = _factor(s.d, n_embd, "width") if n_embd else int(factor)
    kd = _factor(s.L, n_layer, "depth") if n_layer else int(factor)
    if embeddings not in ("mean", "sum"):
        raise GrowlmError(f"vcycle embeddings must be 'mean' or 'sum', not {embeddings!r}")
    if s.h % k or s.g % k:
        raise GrowlmError(f"{s.h} heads ({s.g} key/value heads) cannot be merged in groups of {k}")
    ax = _axes(s, k)
    W = unpack(model)
    depth = groups(s.L, kd, pairing)
    blocks = []
    for members in depth:
        group = [W["blocks"][int(i)] for i in members]
        avg = {key: None if group[0][key] is None else torch.stack([b[key] for b in group]).mean(0) for key in group[0]}
        blk = {}
        for key, (ain, aout) in _ROLES.items():
            t = avg.get(key)
            if t is None:
                blk[key] = None
                continue
            t = _merge_out(t, ax[aout])
            blk[key] = _merge_in(t, ax[ain]) if ain else t
        blocks.append(blk)
    scale = k if embeddings == "sum" else 1.0
    out = {"wte": _merge_out(W["wte"], ax["res"]) * scale,
           "wpe": None if W["wpe"] is None else _merge_out(W["wpe"], ax["res"]) * scale,
           "lnf_w": _merge_out(W["lnf_w"], ax["res"]), "lnf_b": None if W["lnf_b"] is None else _merge_out(W["lnf_b"], ax["res"]),
           "blocks": blocks, "head": None}
    if W["head"] is None:  # a tied head reads the coarse residual: the final norm sums the k copies' logits
        out["lnf_w"] = out["lnf_w"] * k
        out["lnf_b"] = None if out["lnf_b"] is None else out["lnf_b"] * k
    else:
        out["head"] = _merge_in(W["head"].T, ax["res"]).T
    return pack(out, target_config(model.config, n_embd=s.d // k, n_layer=s.L // kd, n_head=s.h // k))


def decoalesce(model, *, factor: int = 2, pairing: str = "stride", embeddings: str = "mean",
               n_embd: int | None = None, n_layer: int | None = None):
    """Copy back up by `factor` (see the module docstring): width by tiling, exact; depth by copying each
    block into its group (the pairing's)."""
    s = ModelShape.of(model)
    k = _factor(n_embd, s.d, "width") if n_embd else int(factor)
    kd = _factor(n_layer, s.L, "depth") if n_layer else int(factor)
    big = s.resized(n_embd=s.d * k, n_layer=s.L * kd, n_head=s.h * k)
    ax = _axes(big, k)
    W = unpack(model)

    def spread(t: torch.Tensor, g: torch.Tensor, dim: int, divide: bool) -> torch.Tensor:
        """Copies along `dim` into the coarse units' groups (divided by k on an input axis)."""
        t = t.movedim(dim, 0)
        out = torch.empty((g.numel(), *t.shape[1:]), dtype=t.dtype)
        for c in range(g.shape[1]):
            out[g[:, c]] = t
        out = out / k if divide else out
        return out.movedim(0, dim)

    def grow_block(blk: dict) -> dict:
        new = {}
        for key, (ain, aout) in _ROLES.items():
            t = blk.get(key)
            if t is None:
                new[key] = None
                continue
            t = spread(t, ax[aout], t.dim() - 1, divide=False)
            new[key] = spread(t, ax[ain], 0, divide=True) if ain else t
        return new

    coarse = [grow_block(b) for b in W["blocks"]]
    depth = groups(s.L * kd, kd, pairing)
    blocks = [None] * (s.L * kd)
    for j, members in enumerate(depth):
        for i in members:
            blocks[int(i)] = {key: None if v is None else v.clone() for key, v in coarse[j].items()}
    scale = 1.0 / k if embeddings == "sum" else 1.0
    out = {"wte": spread(W["wte"], ax["res"], 1, divide=False) * scale,
           "wpe": None if W["wpe"] is None else spread(W["wpe"], ax["res"], 1, divide=False) * scale,
           "lnf_w": spread(W["lnf_w"], ax["res"], 0, divide=False),
           "lnf_b": None if W["lnf_b"] is None else spread(W["lnf_b"], ax["res"], 0, divide=False),
           "blocks": blocks, "head": None}
    if W["head"] is None:
        out["lnf_w"] = out["lnf_w"] / k
        out["lnf_b"] = None if out["lnf_b"] is None else out["lnf_b"] / k
    else:
        out["head"] = spread(W["head"], ax["res"], 1, divide=True)
    return pack(out, target_config(model.config, n_embd=big.d, n_layer=big.L, n_head=big.h))


def interpolate(before, coarse, alpha: float = 0.5, *, factor: int | None = None, pairing: str = "stride",
                embeddings: str = "mean"):
    """(1 - alpha) * before + alpha * decoalesce(coarse), parameter by parameter, in `before`'s shape."""
    if not 0.0 <= alpha <= 1.0:
        raise GrowlmError(f"alpha must be in [0, 1], not {alpha}")
    s = ModelShape.of(before)
    up = decoalesce(coarse, n_embd=s.d, n_layer=s.L, pairing=pairing, embeddings=embeddings) if factor is None else \
        decoalesce(coarse, factor=factor, pairing=pairing, embeddings=embeddings)
    a, b = state_dict_of(unpack(before), before.config), state_dict_of(unpack(up), up.config)
    if a.keys() != b.keys():
        raise GrowlmError("the coarse and the large model differ in head tying")
    mixed = {key: (1 - alpha) * a[key] + alpha * b[key].to(a[key].dtype) for key in a}
    out = pack(unpack(before), before.config)  # a copy in the large model's config, then overwrite
    out.load_state_dict(mixed, strict=False)
    return out


def vcycle_plan(*, levels: int, steps: int, stage_share: float, coarse_share: float, lr: float,
                lr_multiplier: float) -> list[dict]:
    """The training stages of a V with `levels` levels for a baseline of `steps` optimizer steps:
    [{"level", "direction" (down / bottom / up), "steps", "lr", "warmup_steps"}], level 1 the large
    model. Down: each level above the coarsest, `stage_share` of the steps (level 1 all warm-up, as
    the authors' stage 1; deeper levels without warm-up; a share of 0 coalesces the level's
    initialisation untrained, as growlm's V-cycle did before); bottom: the coarsest, `coarse_share`;
    up: every intermediate level again, `stage_share`, without warm-up. The large model's last stage
    is the refinement (its recipe: `growlm.recipes`)."""
    if levels < 2:
        raise GrowlmError(f"vcycle.levels must be at least 2 (the large model and one coarser), not {levels}")
    out = []
    for level in range(1, levels):
        n = round(stage_share * steps)
        if n == 0:
            continue
        out.append({"level": level, "direction": "down", "steps": n, "lr": lr * lr_multiplier ** (level - 1),
                    "warmup_steps": n if level == 1 else 0})
    out.append({"level": levels, "direction": "bottom", "steps": max(1, round(coarse_share * steps)),
                "lr": lr * lr_multiplier ** (levels - 1), "warmup_steps": 0})
    for level in range(levels - 1, 1, -1):
        out.append({"level": level, "direction": "up", "steps": max(1, round(stage_share * steps)),
                    "lr": lr * lr_multiplier ** (level - 1), "warmup_steps": 0})
    return out


@runs("vcycle")
def run(*, vcycle: dict, train: dict, model: dict, seed: int, train_file, val_file, tokenizer_dir,
        out_dir, memory_limit_gb: float | None = None, compile: bool | str | None = None):
    """The Multi-Level V-cycle as one more arm (it reuses no small model), the authors' recipe
    (`vcycle_plan` above): M_0's own initialisation trained briefly at full size (all warm-up),
    coalesced, the coarse model trained at a multiple of the rate with a fresh optimizer (with more
    levels: coalesced again, and back up), de-coalesced and interpolated with the weights from before
    coalescing; the refinement then trains the large model (its recipe: no re-warm-up). `train`: the
    large arms' training settings at the reference budget (the shortest of the sweep), whose steps the
    stages' shares are of; every stage's FLOPs are the growth cost, its ledger kept in the grown
    folder. `compile`: train.compile, for every stage (each stage's model is compiled once: a run starts
    from an empty compile cache); None: what the workflow's run says (`COMPILE_ENV`, which the Snakefile
    sets for every job it starts: how a job runs is never one of its params)."""
    if compile is None:
        compile = compile_from_env()
    k, levels = int(vcycle["factor"]), int(vcycle["levels"])
    pairing, embeddings = vcycle["pairing"], vcycle["embeddings"]
    # its stages decay by a cosine, as its authors' do, whatever the large arms' schedule (growlm.recipes)
    base = TrainConfig.from_dict(train, device=choose_device(), compile=compile, schedule=VCYCLE_STAGE_SCHEDULE)
    plan = vcycle_plan(levels=levels, steps=base.steps, stage_share=float(vcycle["stage_share"]),
                       coarse_share=float(vcycle["coarse_share"]), lr=base.lr,
                       lr_multiplier=float(vcycle["lr_multiplier"]))
    model_now = build_model(seed=seed, vocab_size=vocab_size(tokenizer_dir), **model)
    out_dir = Path(out_dir)
    before: dict[int, torch.nn.Module] = {}  # each level's weights just before it was coalesced
    stages, flops, wall, current = [], 0, 0.0, 1
    for i, stage in enumerate(plan, start=1):
        level = stage["level"]
        while current < level:  # down: coalesce into the next level
            before[current] = model_now
            model_now = coalesce(model_now.cpu(), factor=k, pairing=pairing, embeddings=embeddings)
            current += 1
        if level < current:  # up: de-coalesce into this level, interpolated with its weights from before
            model_now = interpolate(before[level], model_now.cpu(), float(vcycle["alpha"]), factor=k,
                                    pairing=pairing, embeddings=embeddings)
            current = level
        cfg = base.with_(tokens=stage["steps"] * base.batch_size * base.context, lr=stage["lr"],
                         warmup_steps=stage["warmup_steps"], seed=base.seed + 7919 * i)
        job = TrainingJob(cfg, out_dir=out_dir / f"stage{i}_level{level}_{stage['direction']}",
                          train_file=train_file, val_file=val_file, tokenizer_dir=tokenizer_dir,
                          memory_limit_gb=memory_limit_gb,
                          info={"role": f"vcycle stage {i}: level {level} {stage['direction']}"})
        summary = run_job(job, model=model_now)  # trains model_now in place
        flops += summary["flops"]
        wall += summary["wall_s"] - summary.get("compile_s", 0.0)  # training time, compilation left out
        stages.append({**stage, "stage": i, "flops": summary["flops"], "final_val_loss": summary["final_val_loss"],
                       "width": ModelShape.of(model_now).d, "depth": ModelShape.of(model_now).L,
                       "mode": summary["mode"]})  # growlm.modes: the comparison names it in M_1's
        log(f"V-cycle stage {i}: level {level} ({stage['direction']}), width {stages[-1]['width']}, "
            f"{stage['steps']} steps at lr {stage['lr']:.3g}: val loss {summary['final_val_loss']}")
    grown = interpolate(before[1], model_now.cpu(), float(vcycle["alpha"]), factor=k, pairing=pairing,
                        embeddings=embeddings)
    log(f"V-cycle: {levels} levels by {k} ({pairing} pairing), {len(stages)} stages, {flops:.3g} FLOPs; "
        f"interpolated with alpha {vcycle['alpha']}")
    return grown, {"flops": flops, "wall_s": wall, "stages": stages}
