"""Shared machinery of the growth operators: GPT-2 weights as plain tensors, and the width engine.

Weights of a `GPT2LMHeadModel` are handled as a dict (`unpack` / `pack`)::

    {"wte": (V, d), "wpe": (T, d), "lnf_w": (d,), "lnf_b": (d,), "head": (V, d) or None (tied),
     "blocks": [{"ln1_w", "ln1_b", "q_w", "q_b", "k_w", "k_b", "v_w", "v_b", "o_w", "o_b",
                 "ln2_w", "ln2_b", "fc_w", "fc_b", "pr_w", "pr_b"}, ...]}

Matrices keep HF's Conv1D orientation (in, out): y = x @ W + b. `q_w`, `k_w`, `v_w` are the three
(d, d) parts of the fused `c_attn`; output channel h*dh + e of q/k/v is channel e of head h.

The width engine (`WidthEngine`) implements the residual-lift algebra of width growth for n members
at once. A `WidthPlan` says, for every new
residual coordinate, attention head and MLP unit, which member and which source unit it copies
(or, for a residual coordinate, `-1` = LEMON "mean" residue coordinate). Then:

* writers (wte, wpe, attn/mlp c_proj columns and biases) copy their source output columns;
  residue columns get the member's row mean, so the residue coordinate always holds mean(x_m);
* readers (q/k/v, c_fc, attn c_proj rows = head channels, mlp c_proj rows = MLP units, an untied
  lm_head) split each source input row over its copies (1/count each, plus optional cancelling
  noise: "pairs" = +N/-N on pairs of copies, HyperCloning; "centered" = noise minus its mean over
  the copies, LEMON-style unequal split); residue rows are free (LN output there is 0);
* weights connecting different members are zero (block-diagonal);
* LN: gamma copied and scaled by sqrt(s_m), beta copied (0 on residues), eps_m = s_m * eps, where
  s_m = (copied coordinates of member m) / (coordinates of member m);
* tied head: ln_f gamma/beta divided by n * count (so plain tying gives the members' logit mean);
  untied head: its copies divided by n * count instead.

With one member and uniform copy counts this is exact in a plain GPT-2 (HyperCloning, LEMON). With
n members it is exact when each member's coordinates are layer-normalised separately (concat).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import GPT2Config, GPT2LMHeadModel

from growlm.errors import GrowlmError
from growlm.shape import ModelShape

BLOCK_KEYS = ("ln1_w", "ln1_b", "q_w", "q_b", "k_w", "k_b", "v_w", "v_b", "o_w", "o_b",
              "ln2_w", "ln2_b", "fc_w", "fc_b", "pr_w", "pr_b")


# ----------------------------------------------------------------------------------------------
# configs
# ----------------------------------------------------------------------------------------------

def mlp_width(config: GPT2Config, n_embd: int) -> int | None:
    """`n_inner` of the grown config: None (= 4 d) if the source uses the default, else scaled."""
    if config.n_inner is None:
        return None
    return int(round(config.n_inner * n_embd / config.n_embd))


def target_config(src: GPT2Config, *, n_embd: int, n_layer: int, n_head: int,
                  n_inner: int | None = "same", eps: float | None = None) -> GPT2Config:
    """A copy of `src` with a new width/depth/head count (and optionally MLP width, LN epsilon)."""
    d = src.to_dict()
    for k in ("architectures", "_name_or_path", "transformers_version", "dtype", "torch_dtype"):
        d.pop(k, None)
    d.update(n_embd=n_embd, n_layer=n_layer, n_head=n_head)
    d["n_inner"] = mlp_width(src, n_embd) if n_inner == "same" else n_inner
    if eps is not None:
        d["layer_norm_epsilon"] = float(eps)
    config = GPT2Config(**d)
    config._attn_implementation = "sdpa"
    return config


# ----------------------------------------------------------------------------------------------
# model <-> weights
# ----------------------------------------------------------------------------------------------

def unpack(model: GPT2LMHeadModel) -> dict:
    """The weights of a GPT2LMHeadModel as detached tensors (see the module docstring)."""
    t = model.transformer
    d = model.config.n_embd
    blocks = []
    for blk in t.h:
        ca_w, ca_b = blk.attn.c_attn.weight.detach(), blk.attn.c_attn.bias.detach()
        blocks.append({
            "ln1_w": blk.ln_1.weight.detach(), "ln1_b": blk.ln_1.bias.detach(),
            "q_w": ca_w[:, :d], "k_w": ca_w[:, d:2 * d], "v_w": ca_w[:, 2 * d:],
            "q_b": ca_b[:d], "k_b": ca_b[d:2 * d], "v_b": ca_b[2 * d:],
            "o_w": blk.attn.c_proj.weight.detach(), "o_b": blk.attn.c_proj.bias.detach(),
            "ln2_w": blk.ln_2.weight.detach(), "ln2_b": blk.ln_2.bias.detach(),
            "fc_w": blk.mlp.c_fc.weight.detach(), "fc_b": blk.mlp.c_fc.bias.detach(),
            "pr_w": blk.mlp.c_proj.weight.detach(), "pr_b": blk.mlp.c_proj.bias.detach(),
        })
    tied = model.lm_head.weight is t.wte.weight or bool(getattr(model.config, "tie_word_embeddings", True))
    return {"wte": t.wte.weight.detach(), "wpe": t.wpe.weight.detach(),
            "lnf_w": t.ln_f.weight.detach(), "lnf_b": t.ln_f.bias.detach(),
            "head": None if tied else model.lm_head.weight.detach(), "blocks": blocks}


def state_dict_of(W: dict) -> dict[str, torch.Tensor]:
    """HF state-dict names for weights `W` (lm_head only when untied)."""
    sd = {"transformer.wte.weight": W["wte"], "transformer.wpe.weight": W["wpe"],
          "transformer.ln_f.weight": W["lnf_w"], "transformer.ln_f.bias": W["lnf_b"]}
    for i, b in enumerate(W["blocks"]):
        p = f"transformer.h.{i}."
        sd[p + "ln_1.weight"], sd[p + "ln_1.bias"] = b["ln1_w"], b["ln1_b"]
        sd[p + "attn.c_attn.weight"] = torch.cat([b["q_w"], b["k_w"], b["v_w"]], 1)
        sd[p + "attn.c_attn.bias"] = torch.cat([b["q_b"], b["k_b"], b["v_b"]], 0)
        sd[p + "attn.c_proj.weight"], sd[p + "attn.c_proj.bias"] = b["o_w"], b["o_b"]
        sd[p + "ln_2.weight"], sd[p + "ln_2.bias"] = b["ln2_w"], b["ln2_b"]
        sd[p + "mlp.c_fc.weight"], sd[p + "mlp.c_fc.bias"] = b["fc_w"], b["fc_b"]
        sd[p + "mlp.c_proj.weight"], sd[p + "mlp.c_proj.bias"] = b["pr_w"], b["pr_b"]
    if W["head"] is not None:
        sd["lm_head.weight"] = W["head"]
    return sd


def empty_model(config: GPT2Config) -> GPT2LMHeadModel:
    """A GPT2LMHeadModel on the meta device (no random initialisation cost)."""
    with torch.device("meta"):
        return GPT2LMHeadModel(config)


def load_into(model: GPT2LMHeadModel, sd: dict[str, torch.Tensor]) -> GPT2LMHeadModel:
    sd = {k: v.detach().clone().contiguous() for k, v in sd.items()}
    tied = bool(getattr(model.config, "tie_word_embeddings", True))
    if tied:
        sd.pop("lm_head.weight", None)
    missing, unexpected = model.load_state_dict(sd, strict=False, assign=True)
    missing = [k for k in missing if not (tied and k == "lm_head.weight")]
    if missing or unexpected:
        raise RuntimeError(f"weights do not fit the config: missing {missing}, unexpected {unexpected}")
    if tied:
        model.lm_head.weight = model.transformer.wte.weight
    for name, buf in list(model.named_buffers()):
        if buf.device.type == "meta":  # no persistent buffers in GPT-2 today; guard anyway
            raise RuntimeError(f"buffer {name} was not materialised")
    model.eval()
    return model


def pack(W: dict, config: GPT2Config) -> GPT2LMHeadModel:
    """A plain GPT2LMHeadModel with `config` holding weights `W`."""
    if W["head"] is None and not config.tie_word_embeddings:
        raise RuntimeError("untied config but no lm_head weight")
    if W["head"] is not None and config.tie_word_embeddings:
        config = GPT2Config(**{**config.to_dict(), "tie_word_embeddings": False})
        config._attn_implementation = "sdpa"
    return load_into(empty_model(config), state_dict_of(W))


def with_blocks(W: dict, blocks: list[dict]) -> dict:
    return {**W, "blocks": blocks}


# ----------------------------------------------------------------------------------------------
# depth plans
# ----------------------------------------------------------------------------------------------

def insertion_plan(L0: int, L1: int, position: str) -> list[int | None]:
    """Target block list: source block index, or None for an inserted block (after its neighbour).

    "interleave": the L1-L0 new blocks are spread evenly, each after a source block;
    "top": all new blocks after the last source block.
    """
    m = L1 - L0
    if position == "top":
        return list(range(L0)) + [None] * m
    if position != "interleave":
        raise GrowlmError(f"position must be 'interleave' or 'top', not {position!r}")
    out: list[int | None] = []
    for i in range(L0):
        out.append(i)
        out.extend([None] * ((i + 1) * m // L0 - i * m // L0))
    return out


def neighbour_of(plan: list[int | None]) -> list[int]:
    """For each target block, the source block it is or follows (the one below; block 0 if none)."""
    out, last = [], 0
    for p in plan:
        if p is not None:
            last = p
        out.append(last)
    return out


# ----------------------------------------------------------------------------------------------
# the width engine
# ----------------------------------------------------------------------------------------------

@dataclass
class WidthPlan:
    """Where every unit of the grown model comes from (see the module docstring)."""

    n: int  # members
    res_mem: torch.Tensor  # (d1,) long
    res_src: torch.Tensor  # (d1,) long, -1 = residue (mean) coordinate
    head_mem: torch.Tensor  # (h1,)
    head_src: torch.Tensor  # (h1,)
    mlp_mem: torch.Tensor  # (f1,)
    mlp_src: torch.Tensor  # (f1,)


@dataclass
class _Axis:
    mem: torch.Tensor  # member of each new index
    idx: torch.Tensor  # source index; `size` (one past the end) for residue entries
    key: torch.Tensor  # mem * (size + 1) + idx: copies of one source unit share a key
    count: torch.Tensor  # copies of the same source unit (per new index)
    size: int  # source size
    residue: torch.Tensor  # bool

    @staticmethod
    def make(mem: torch.Tensor, src: torch.Tensor, size: int) -> "_Axis":
        residue = src < 0
        idx = torch.where(residue, torch.full_like(src, size), src)
        key = mem * (size + 1) + idx
        count = torch.bincount(key)[key]
        return _Axis(mem, idx, key, count, size, residue)

    def factor(self) -> torch.Tensor:
        """Reader split factor: 1/count for copies, 0 for residue entries."""
        f = 1.0 / self.count.double()
        return torch.where(self.residue, torch.zeros_like(f), f)


def _head_channels(mem: torch.Tensor, src: torch.Tensor, dh: int) -> tuple[torch.Tensor, torch.Tensor]:
    e = torch.arange(dh)
    return mem.repeat_interleave(dh), (src[:, None] * dh + e[None, :]).reshape(-1)


def _occurrence_rank(key: torch.Tensor) -> torch.Tensor:
    """For each entry, how many earlier entries share its key (0, 1, 2, ...)."""
    n = key.numel()
    order = torch.argsort(key * (n + 1) + torch.arange(n))
    sk = key[order]
    first = torch.ones(n, dtype=torch.bool)
    first[1:] = sk[1:] != sk[:-1]
    starts = torch.cummax(torch.where(first, torch.arange(n), torch.zeros(n, dtype=torch.long)), 0).values
    rank = torch.empty(n, dtype=torch.long)
    rank[order] = torch.arange(n) - starts
    return rank


def copy_noise(ax: _Axis, cols: int, std: float, mode: str, gen: torch.Generator,
               dtype: torch.dtype) -> torch.Tensor:
    """(len(ax), cols) noise that sums to zero over the copies of every source row."""
    A = ax.mem.numel()
    if mode == "centered":
        N = torch.randn(A, cols, generator=gen, dtype=dtype) * std
        K = int(ax.key.max()) + 1
        mean = torch.zeros(K, cols, dtype=dtype).index_add_(0, ax.key, N)
        mean = mean / torch.bincount(ax.key, minlength=K).clamp(min=1).to(dtype)[:, None]
        N = N - mean[ax.key]
        N[(ax.count == 1) | ax.residue] = 0.0
        return N
    if mode == "pairs":
        rank = _occurrence_rank(ax.key)
        K = int(ax.key.max()) + 1
        table = torch.full((K, int(rank.max()) + 1), -1, dtype=torch.long)
        table[ax.key, rank] = torch.arange(A)
        first = (rank % 2 == 0) & (rank + 1 < ax.count) & ~ax.residue
        rows = first.nonzero().squeeze(1)
        partner = table[ax.key[rows], rank[rows] + 1]
        out = torch.zeros(A, cols, dtype=dtype)
        N = torch.randn(rows.numel(), cols, generator=gen, dtype=dtype) * std
        out[rows] = N
        out[partner] = -N
        return out
    raise GrowlmError(f"unknown noise mode {mode!r}")


class WidthEngine:
    """Applies a `WidthPlan` to the stacked weights of n members of one shape."""

    def __init__(self, members_W: list[dict], shape: ModelShape, plan: WidthPlan, *, gen: torch.Generator,
                 noise: float = 0.0, noise_mode: str = "pairs", residue_std: float = 0.0):
        self.Ws, self.s, self.plan, self.gen = members_W, shape, plan, gen
        self.noise, self.noise_mode, self.residue_std = noise, noise_mode, residue_std
        self.dtype = members_W[0]["wte"].dtype
        # compute in float64 for float64 members (exactness tests), else float32
        self.cdtype = torch.float64 if self.dtype == torch.float64 else torch.float32
        s = shape
        self.res = _Axis.make(plan.res_mem, plan.res_src, s.d)
        hc_mem, hc_src = _head_channels(plan.head_mem, plan.head_src, s.dh)
        # copies of one head share a key (count = copies of the head, not of the channel)
        self.hc = _Axis.make(hc_mem, hc_src, s.d)
        self.mlp = _Axis.make(plan.mlp_mem, plan.mlp_src, s.f)
        n = plan.n
        # LN factors per member group: s_m = copied coords / all coords of member m
        d1 = plan.res_mem.numel()
        tot = torch.bincount(plan.res_mem, minlength=n).double()
        cop = torch.bincount(plan.res_mem[~self.res.residue], minlength=n).double()
        if (tot == 0).any():
            raise GrowlmError("every member needs at least one coordinate in the grown residual stream")
        self.group_s = cop / tot  # (n,)
        self.d1 = d1

    # -- primitives -------------------------------------------------------------------------
    def _stack(self, get) -> torch.Tensor:
        return torch.stack([get(W) for W in self.Ws]).to(self.cdtype)

    def matrix(self, get, ax_in: _Axis, ax_out: _Axis, *, reader_noise: bool = True) -> torch.Tensor:
        """Grow a Conv1D matrix (in, out): block-diagonal over members."""
        Wst = self._stack(get)  # (n, a, b)
        n, a, b = Wst.shape
        Wa = Wst
        if bool(ax_out.residue.any()):
            Wa = torch.cat([Wa, Wa.mean(2, keepdim=True)], 2)  # residue out column = row mean
        if bool(ax_in.residue.any()):
            Wa = torch.cat([Wa, torch.zeros(n, 1, Wa.shape[2], dtype=Wa.dtype)], 1)  # residue in row = 0
        fac = ax_in.factor().to(self.cdtype)
        if n == 1:
            W = (Wa[0].index_select(0, ax_in.idx) * fac[:, None]).index_select(1, ax_out.idx)
            same = None
        else:
            W = torch.empty(ax_in.mem.numel(), ax_out.mem.numel(), dtype=self.cdtype)
            for m in range(n):
                cols = (ax_out.mem == m).nonzero().squeeze(1)
                f_m = fac * (ax_in.mem == m).to(self.cdtype)
                W[:, cols] = (Wa[m].index_select(0, ax_in.idx) * f_m[:, None]).index_select(1, ax_out.idx[cols])
            same = (ax_in.mem[:, None] == ax_out.mem[None, :]).to(self.cdtype)
        if reader_noise and self.noise > 0 and bool((ax_in.count > 1).any()):
            N = copy_noise(ax_in, W.shape[1], float(Wst.std()) * self.noise, self.noise_mode, self.gen, W.dtype)
            W = W + (N if same is None else N * same)
        if self.residue_std > 0 and bool(ax_in.residue.any()):
            R = torch.randn(int(ax_in.residue.sum()), W.shape[1], generator=self.gen, dtype=W.dtype) * self.residue_std
            W[ax_in.residue] = R if same is None else R * same[ax_in.residue]
        return W.to(self.dtype)

    def vector(self, get, ax: _Axis) -> torch.Tensor:
        """Grow a bias on an output axis (residue entries: the member's mean)."""
        v = self._stack(get)
        va = torch.cat([v, v.mean(1, keepdim=True)], 1)
        return va[ax.mem, ax.idx].to(self.dtype)

    def embedding(self, get) -> torch.Tensor:
        """Grow a (rows, d) embedding on its residual axis (copies, not divided)."""
        E = self._stack(get)  # (n, R, d)
        Ea = torch.cat([E, E.mean(2, keepdim=True)], 2)
        return Ea[self.res.mem, :, self.res.idx].T.contiguous().to(self.dtype)

    def layer_norm(self, get_w, get_b, extra: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        g = self.vector(get_w, self.res).double()
        b = self.vector(get_b, self.res).double()
        b[self.res.residue] = 0.0
        g = g * self.group_s.sqrt()[self.res.mem]
        if extra is not None:
            g, b = g * extra, b * extra
        return g.to(self.dtype), b.to(self.dtype)

    # -- the whole model ----------------------------------------------------------------------
    def grow(self) -> dict:
        res, hc, mlp = self.res, self.hc, self.mlp
        n = self.plan.n
        blocks = []
        for l in range(self.s.L):
            def g(key, l=l):
                return lambda W: W["blocks"][l][key]
            blk = {}
            blk["ln1_w"], blk["ln1_b"] = self.layer_norm(g("ln1_w"), g("ln1_b"))
            for p in ("q", "k", "v"):
                blk[p + "_w"] = self.matrix(g(p + "_w"), res, hc)
                blk[p + "_b"] = self.vector(g(p + "_b"), hc)
            blk["o_w"] = self.matrix(g("o_w"), hc, res)
            blk["o_b"] = self.vector(g("o_b"), res)
            blk["ln2_w"], blk["ln2_b"] = self.layer_norm(g("ln2_w"), g("ln2_b"))
            blk["fc_w"] = self.matrix(g("fc_w"), res, mlp)
            blk["fc_b"] = self.vector(g("fc_b"), mlp)
            blk["pr_w"] = self.matrix(g("pr_w"), mlp, res)
            blk["pr_b"] = self.vector(g("pr_b"), res)
            blocks.append(blk)
        out = {"wte": self.embedding(lambda W: W["wte"]), "wpe": self.embedding(lambda W: W["wpe"]),
               "blocks": blocks}
        per_coord = 1.0 / (n * res.count.double())  # logit average over members and copies
        if self.s.tied:
            out["lnf_w"], out["lnf_b"] = self.layer_norm(lambda W: W["lnf_w"], lambda W: W["lnf_b"], per_coord)
            out["head"] = None
        else:
            out["lnf_w"], out["lnf_b"] = self.layer_norm(lambda W: W["lnf_w"], lambda W: W["lnf_b"])
            # lm_head (V, d) is (out, in): grow its transpose as a reader of the residual stream
            Hst = self._stack(lambda W: W["head"])  # (n, V, d)
            H = Hst[res.mem, :, res.idx.clamp(max=self.s.d - 1)].T  # (V, d1)
            H = H * (res.factor() / n)[None, :]
            if self.noise > 0:
                std = float(Hst.std()) * self.noise
                H = H + copy_noise(res, self.s.V, std, self.noise_mode, self.gen, H.dtype).T
            if self.residue_std > 0 and bool(res.residue.any()):
                H[:, res.residue] = torch.randn(self.s.V, int(res.residue.sum()), generator=self.gen,
                                                dtype=H.dtype) * self.residue_std
            out["head"] = H.contiguous().to(self.dtype)
        return out

    def group_eps(self, eps: float) -> torch.Tensor:
        """LN epsilon of each member group (s_m * eps)."""
        return self.group_s * eps


def tile_plan(n_members: int, d0: int, h0: int, f0: int, d1: int, h1: int, f1: int) -> WidthPlan:
    """Per member group: floor copies of the member's units, then residue coordinates (LEMON).

    The residual is split into n contiguous groups (sizes differ by at most one); group m holds
    k_m = D_m // d0 tiled copies of member m's coordinates and D_m - k_m d0 residue coordinates.
    Heads and MLP units: the members' units first (block diagonal), the rest circular copies
    over (member, unit).
    """
    n = n_members
    sizes = [d1 // n + (1 if m < d1 % n else 0) for m in range(n)]
    res_mem, res_src = [], []
    for m, D in enumerate(sizes):
        k = D // d0
        if k < 1:
            raise GrowlmError(f"width {d1} gives member group {m} only {D} coordinates, fewer than d0={d0}")
        res_mem.append(torch.full((D,), m, dtype=torch.long))
        res_src.append(torch.cat([torch.arange(k * d0) % d0, torch.full((D - k * d0,), -1, dtype=torch.long)]))

    def units(total: int, per: int) -> tuple[torch.Tensor, torch.Tensor]:
        if total < n * per:
            raise GrowlmError(f"{total} units cannot hold {n} members x {per}")
        j = torch.arange(total)
        # first n*per: member-major block-diagonal; then circular over (member, unit)
        mem = torch.where(j < n * per, j // per, (j - n * per) % n)
        src = torch.where(j < n * per, j % per, ((j - n * per) // n) % per)
        return mem, src

    head_mem, head_src = units(h1, h0)
    mlp_mem, mlp_src = units(f1, f0)
    return WidthPlan(n, torch.cat(res_mem), torch.cat(res_src), head_mem, head_src, mlp_mem, mlp_src)


def single_tile_plan(d0, h0, f0, d1, h1, f1) -> WidthPlan:
    """One member, HyperCloning layout: new unit i copies source unit i mod size."""
    z = lambda k: torch.zeros(k, dtype=torch.long)  # noqa: E731
    return WidthPlan(1, z(d1), torch.arange(d1) % d0, z(h1), torch.arange(h1) % h0, z(f1), torch.arange(f1) % f0)


def ramp(step: int, steps: int) -> float:
    """0 at step 0, rising linearly to 1 at `steps` (1 at once when steps <= 0)."""
    if steps <= 0:
        return 1.0
    return min(1.0, max(0.0, step / steps))


def generator(seed: int) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(int(seed))
    return g
