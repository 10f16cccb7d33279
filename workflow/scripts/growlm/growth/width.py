"""The width engine: the residual-lift algebra of width growth, for n members at once.

It grows weights in the weight form of `growlm.growth.algebra` (matrices (in, out), y = x @ W + b;
a part a family does not have is None; output channel i dh + e of q is channel e of query head i,
and query head i reads key/value head i // r). A `WidthPlan` says, for every new residual
coordinate, attention head and MLP unit, which member and which source unit it copies (or, for a
residual coordinate, `-1` = a residue coordinate); `tile_plan` and `single_tile_plan` make the
usual ones, `kv_plan` and `regrouped_heads` place the key/value heads, and `WidthEngine` applies a
plan. Then:

* writers (wte, wpe, o and pr columns and biases) copy their source output columns; residue
  columns hold what keeps the norm exact: under LayerNorm the member's row mean, so the residue
  coordinate holds mean(x) (LEMON's mean padding: the mean of the grown residual is the source's,
  its variance s times the source's); under RMSNorm zero, so the residue coordinate holds 0 (no mean
  is subtracted, and the mean square of the grown residual is s times the source's);
* readers (q/k/v, fc and gate, o rows = query head channels, pr rows = MLP units, an untied
  lm_head) split each source input row over its copies (1/count each, plus optional cancelling
  noise: "pairs" = +N/-N on pairs of copies, HyperCloning; "centered" = noise minus its mean over
  the copies, LEMON-style unequal split); residue rows are free (the norm output there is 0);
* key/value heads are copied with the query heads they serve: a plan copies whole groups of r query
  heads, and each new group's key/value head copies the source group's, so every query head reads
  the copy of its source's key/value head (the query heads per key/value head are kept);
* weights connecting different members are zero (block-diagonal);
* the norm: gamma copied and scaled by sqrt(s_m), beta copied (0 on residues), eps_m = s_m * eps,
  where s_m = (copied coordinates of member m) / (coordinates of member m): LayerNorm's variance and
  RMSNorm's mean square both scale by s_m on the grown residual;
* tied head: the final norm's gamma/beta divided by n * count (so plain tying gives the members'
  logit mean); untied head: its copies divided by n * count instead.

With one member and uniform copy counts this is exact in either family (HyperCloning, LEMON). With
n members it is exact when each member's coordinates are normalised separately (concat).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from growlm.errors import GrowlmError
from growlm.shape import ModelShape, regrouped_r


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
    r: int | None = None  # query heads per key/value head of the grown model; None: the source's


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


def kv_plan(head_mem: torch.Tensor, head_src: torch.Tensor, r: int,
            r_new: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(member, source key/value head) of every new key/value head, for query heads copied in whole
    groups: new key/value head i serves new query heads i r' .. i r' + r' - 1 (r' = `r_new`, the grown
    model's query heads per key/value head; default r, the source's), which must all come from one
    member's source group of r, so that each reads a copy of its source's key/value head (grouped-query
    attention stays exact; a source key/value head may have several copies: `regrouped_heads`).
    r = r' = 1 (multi-head attention): the query heads' own plan."""
    r_new = r if r_new is None else r_new
    if r == 1 and r_new == 1:
        return head_mem, head_src
    if head_mem.numel() % r_new:
        raise GrowlmError(f"{head_mem.numel()} query heads are not whole groups of {r_new} (query heads per "
                          f"key/value head)")
    mem = head_mem.reshape(-1, r_new)
    grp = torch.div(head_src, r, rounding_mode="floor").reshape(-1, r_new)
    if not (bool((mem == mem[:, :1]).all()) and bool((grp == grp[:, :1]).all())):
        raise GrowlmError(f"the grown query heads break their key/value groups (each group of {r_new} query heads "
                          f"must copy one source group); grow by whole groups of heads")
    return mem[:, 0].contiguous(), grp[:, 0].contiguous()


def regrouped_heads(n: int, h0: int, r: int, h1: int,
                    extra: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The query heads of a width whose h1 heads are not whole groups of the source's r query heads per
    key/value head (h1 % r != 0): (member, source head) of each new query head, and r', the grown
    model's query heads per key/value head, for which the key/value heads are duplicated.

    r' is the largest divisor of h1, at most r, for which every (member, source key/value group) can
    hold its r query heads in whole groups of r': each gets ceil(r / r') groups of r' query heads (its
    heads, then copies of them, in order), and the groups left over go to `extra` (one index of
    (member, source group) per group; default circular). A group of r' consecutive new query heads
    then copies heads of one source group, and its key/value head copies that group's (`kv_plan`):
    each query head reads a copy of the key/value head its source read, so grouped-query attention
    stays exact whatever r' is (r' = 1 always fits: one key/value head per query head). The grown model
    has h1 / r' key/value heads, so at least as many per query head as the source."""
    g = h0 // r
    pairs = n * g
    r_new = regrouped_r(n, h0, r, h1)
    per = -(-r // r_new)
    left = h1 // r_new - pairs * per
    if left < 0:
        raise GrowlmError(f"{h1} query heads cannot hold {n} member(s) x {h0} heads")
    if extra is None:
        extra = torch.arange(left) % pairs
    counts = torch.full((pairs,), per, dtype=torch.long) + torch.bincount(extra, minlength=pairs)
    heads = counts * r_new  # query heads of each (member, group)
    pair = torch.arange(pairs).repeat_interleave(heads)
    start = torch.cumsum(heads, 0) - heads
    j = torch.arange(int(heads.sum())) - start[pair]  # position inside its (member, group)
    return (torch.div(pair, g, rounding_mode="floor"), (pair % g) * r + j % r, r_new)


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
    rows, vals = noise_rows(ax, cols, std, mode, gen, dtype)
    out = torch.zeros(ax.mem.numel(), cols, dtype=dtype)
    out[rows] = vals
    return out


def noise_rows(ax: _Axis, cols: int, std: float, mode: str, gen: torch.Generator,
               dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """`copy_noise` as (rows, values): the rows of the axis that get noise (copies of a source row
    copied more than once; never a residue row) and their noise, every other row's being 0. The
    random draws are the same as for the whole matrix, so the result does not depend on which form
    is asked for."""
    A = ax.mem.numel()
    if mode == "centered":
        N = torch.randn(A, cols, generator=gen, dtype=dtype) * std
        rows = ((ax.count > 1) & ~ax.residue).nonzero().squeeze(1)
        if rows.numel() == 0:
            return rows, N[:0]
        sub = N.index_select(0, rows)
        keys, inv = torch.unique(ax.key[rows], return_inverse=True)
        # the copies' sum, added in row order (as index_add_ adds): copy by copy, over all keys at once
        rank = _occurrence_rank(inv)
        acc = torch.zeros(keys.numel(), cols, dtype=dtype)
        for r in range(int(rank.max()) + 1):
            sel = (rank == r).nonzero().squeeze(1)
            acc[inv[sel]] += sub[sel]
        mean = acc / torch.bincount(inv, minlength=keys.numel()).to(dtype)[:, None]
        return rows, sub - mean[inv]
    if mode == "pairs":
        rank = _occurrence_rank(ax.key)
        K = int(ax.key.max()) + 1
        table = torch.full((K, int(rank.max()) + 1), -1, dtype=torch.long)
        table[ax.key, rank] = torch.arange(A)
        first = (rank % 2 == 0) & (rank + 1 < ax.count) & ~ax.residue
        rows = first.nonzero().squeeze(1)
        partner = table[ax.key[rows], rank[rows] + 1]
        N = torch.randn(rows.numel(), cols, generator=gen, dtype=dtype) * std
        return torch.cat([rows, partner]), torch.cat([N, -N])
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
        # what a residue coordinate holds: mean(x) under LayerNorm (LEMON), 0 under RMSNorm
        self.residue_mean = s.norm == "layernorm"
        self.res = _Axis.make(plan.res_mem, plan.res_src, s.d)
        hc_mem, hc_src = _head_channels(plan.head_mem, plan.head_src, s.dh)
        # copies of one head share a key (count = copies of the head, not of the channel)
        self.hc = _Axis.make(hc_mem, hc_src, s.d)
        kv_mem, kv_src = kv_plan(plan.head_mem, plan.head_src, s.r, plan.r)
        kvc_mem, kvc_src = _head_channels(kv_mem, kv_src, s.dh)
        self.kvc = _Axis.make(kvc_mem, kvc_src, s.g * s.dh)
        self.mlp = _Axis.make(plan.mlp_mem, plan.mlp_src, s.f)
        n = plan.n
        # norm factors per member group: s_m = copied coords / all coords of member m
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

    def _pad(self, t: torch.Tensor, dim: int) -> torch.Tensor:
        """`t` with one more entry along `dim`: the residue entry (the mean, or 0 under RMSNorm)."""
        extra = t.mean(dim, keepdim=True) if self.residue_mean else torch.zeros_like(t.narrow(dim, 0, 1))
        return torch.cat([t, extra], dim)

    def matrix(self, get, ax_in: _Axis, ax_out: _Axis, *, reader_noise: bool = True) -> torch.Tensor:
        """Grow a matrix (in, out): block-diagonal over members."""
        if self.plan.n == 1:
            return self._matrix_one(get(self.Ws[0]), ax_in, ax_out, reader_noise)
        Wst = self._stack(get)  # (n, a, b)
        n, a, b = Wst.shape
        Wa = Wst
        if bool(ax_out.residue.any()):
            Wa = self._pad(Wa, 2)  # residue out column = row mean (0 under RMSNorm)
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

    def _matrix_one(self, S: torch.Tensor, ax_in: _Axis, ax_out: _Axis, reader_noise: bool) -> torch.Tensor:
        """`matrix` for one member, computed in the layout the family stores: a Llama matrix is an
        nn.Linear weight (out, in), whose (in, out) view the weight form holds, so it is grown as
        (out, in) and returned as that view again (packing it then copies nothing across the cache).
        The same values as the general path, element for element: each entry is one source entry
        times its reader factor, plus its noise."""
        S = S.to(self.cdtype)
        pad_in, pad_out = bool(ax_in.residue.any()), bool(ax_out.residue.any())
        out_major = not S.is_contiguous() and S.T.is_contiguous()
        if out_major and pad_out and self.residue_mean:  # (no family stores this way and pads with means)
            out_major = False
        fac = ax_in.factor().to(self.cdtype)
        if out_major:
            St = S.T  # (b, a) contiguous
            if pad_out:  # residue out row: 0 (RMSNorm)
                St = torch.cat([St, torch.zeros(1, St.shape[1], dtype=St.dtype)], 0)
            if pad_in:  # residue in column: 0
                St = torch.cat([St, torch.zeros(St.shape[0], 1, dtype=St.dtype)], 1)
            W = St.index_select(0, ax_out.idx).index_select(1, ax_in.idx).mul_(fac[None, :]).T
        else:
            Sa = S
            if pad_out:  # residue out column = row mean (0 under RMSNorm)
                Sa = self._pad(Sa[None], 2)[0]
            if pad_in:  # residue in row = 0
                Sa = torch.cat([Sa, torch.zeros(1, Sa.shape[1], dtype=Sa.dtype)], 0)
            W = Sa.index_select(0, ax_in.idx).mul_(fac[:, None]).index_select(1, ax_out.idx)
        if reader_noise and self.noise > 0 and bool((ax_in.count > 1).any()):
            rows, N = noise_rows(ax_in, W.shape[1], float(S.std()) * self.noise, self.noise_mode, self.gen, W.dtype)
            W[rows] += N
        if self.residue_std > 0 and pad_in:
            W[ax_in.residue] = torch.randn(int(ax_in.residue.sum()), W.shape[1], generator=self.gen,
                                           dtype=W.dtype) * self.residue_std
        return W.to(self.dtype)

    def vector(self, get, ax: _Axis) -> torch.Tensor | None:
        """Grow a bias on an output axis (residue entries: the member's mean, 0 under RMSNorm);
        None for a bias the family does not have."""
        if get(self.Ws[0]) is None:
            return None
        v = self._stack(get)
        va = self._pad(v, 1)
        return va[ax.mem, ax.idx].to(self.dtype)

    def embedding(self, get) -> torch.Tensor | None:
        """Grow a (rows, d) embedding on its residual axis (copies, not divided)."""
        if get(self.Ws[0]) is None:
            return None
        E = self._stack(get)  # (n, R, d)
        Ea = self._pad(E, 2)
        return Ea[self.res.mem, :, self.res.idx].T.contiguous().to(self.dtype)

    def layer_norm(self, get_w, get_b, extra: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """A norm on the residual stream (LayerNorm, or RMSNorm with no bias)."""
        g = self.vector(get_w, self.res).double()
        b = self.vector(get_b, self.res)
        if b is not None:
            b = b.double()
            b[self.res.residue] = 0.0
        g = g * self.group_s.sqrt()[self.res.mem]
        if extra is not None:
            g = g * extra
            b = None if b is None else b * extra
        return g.to(self.dtype), None if b is None else b.to(self.dtype)

    # -- the whole model ----------------------------------------------------------------------
    def grow(self) -> dict:
        res, hc, kvc, mlp = self.res, self.hc, self.kvc, self.mlp
        n = self.plan.n
        blocks = []
        for l in range(self.s.L):
            def g(key, l=l):
                return lambda W: W["blocks"][l][key]
            blk = {}
            blk["ln1_w"], blk["ln1_b"] = self.layer_norm(g("ln1_w"), g("ln1_b"))
            for p, out in (("q", hc), ("k", kvc), ("v", kvc)):
                blk[p + "_w"] = self.matrix(g(p + "_w"), res, out)
                blk[p + "_b"] = self.vector(g(p + "_b"), out)
            blk["o_w"] = self.matrix(g("o_w"), hc, res)
            blk["o_b"] = self.vector(g("o_b"), res)
            blk["ln2_w"], blk["ln2_b"] = self.layer_norm(g("ln2_w"), g("ln2_b"))
            blk["fc_w"] = self.matrix(g("fc_w"), res, mlp)
            blk["fc_b"] = self.vector(g("fc_b"), mlp)
            if self.s.gated:  # the gate is read like fc: its unit u goes with fc's unit u
                blk["gate_w"] = self.matrix(g("gate_w"), res, mlp)
                blk["gate_b"] = self.vector(g("gate_b"), mlp)
            else:
                blk["gate_w"] = blk["gate_b"] = None
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


def tile_plan(n_members: int, d0: int, h0: int, f0: int, d1: int, h1: int, f1: int, r: int = 1) -> WidthPlan:
    """Per member group: floor copies of the member's units, then residue coordinates (LEMON).

    The residual is split into n contiguous groups (sizes differ by at most one); group m holds
    k_m = D_m // d0 tiled copies of member m's coordinates and D_m - k_m d0 residue coordinates.
    Heads and MLP units: the members' units first (block diagonal), the rest circular copies
    over (member, unit). Heads are placed in whole groups of r (the query heads that share a
    key/value head), so grouped-query attention stays exact (`kv_plan`).
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

    if h0 % r:
        raise GrowlmError(f"{h0} heads are not whole groups of {r} query heads per key/value head")
    r_new = None
    if h1 % r:  # the key/value heads are duplicated so that the query heads form whole groups
        head_mem, head_src, r_new = regrouped_heads(n, h0, r, h1)
    else:
        group_mem, group_src = units(h1 // r, h0 // r)
        head_mem = group_mem.repeat_interleave(r)
        head_src = (group_src[:, None] * r + torch.arange(r)[None, :]).reshape(-1)
    mlp_mem, mlp_src = units(f1, f0)
    return WidthPlan(n, torch.cat(res_mem), torch.cat(res_src), head_mem, head_src, mlp_mem, mlp_src, r_new)


def single_tile_plan(d0, h0, f0, d1, h1, f1) -> WidthPlan:
    """One member, HyperCloning layout: new unit i copies source unit i mod size."""
    z = lambda k: torch.zeros(k, dtype=torch.long)  # noqa: E731
    return WidthPlan(1, z(d1), torch.arange(d1) % d0, z(h1), torch.arange(h1) % h0, z(f1), torch.arange(f1) % f0)
