"""Operators that bring several members into one model: `msg_members` and `merge`.

msg_members: MSG with the other members in its new capacity
-------------------------------------------------------------
`msg` grows m_1 alone: its weights go in the old coordinates, everything new is random and masked
in. The new capacity can hold the other members just as well. `msg_members` grows m_1 exactly as
`msg` does (same seed, same random new weights) and then writes member j (j = 2..n) into the new
coordinates, block-diagonally as `concat` does: its residual coordinates, heads and MLP units are
the j-th block of d0 coordinates, h0 heads and f0 units, in every target block that holds an old
block (the `insertion_plan` of msg); its embeddings, position embeddings and final LayerNorm fill
the same coordinates. All of member j is "new" for msg's masks (it sits at coordinates >= d0), so
at step 0 the grown model computes exactly m_1, and the other members enter as the masks ramp to 1.
`cross`: "random" (default) keeps msg's random weights between different members' blocks (masked
like every new weight), "zero" sets them to zero. Needs n d0 <= d1 (the members must fit).

After the ramp the final LayerNorm reads all members' coordinates and the tied head sums their
logits (not an average: msg's own new coordinates are summed the same way); refinement adapts it.
In the Llama family member j's key/value heads take the j-th block of g0 key/value heads (its query
heads the j-th block of h0, so they read their own member's key/value heads), and its gate columns
go with its up columns.

merge: one model of the members' size
-------------------------------------
The members' weights averaged into one model of their own width and depth (axis "width", natural
size the members' own, so `['merge', 'msg']` merges and then grows). Averaging independently
trained networks fails because their hidden units are in arbitrary order; `align: weights` first
permutes each member j >= 2 onto m_1 by weight matching (Ainsworth et al., Git Re-Basin, 2023): one
permutation of the residual coordinates for the whole model, one of the heads (whole heads) and one
of the MLP units per block, chosen by coordinate descent, each step a linear assignment that
maximises the inner product of m_1's weights with the permuted member's. A permutation changes no
function (LayerNorm, attention and the MLP are equivariant to it), so `merge` of m_1 with a permuted
copy of itself returns m_1. `align: none` averages as the weights stand. Not exact in general.

In the Llama family the permutations respect what the function depends on: RMSNorm is equivariant
to a permutation of the residual coordinates as LayerNorm is; a gated MLP unit is (gate column, up
column, down row), permuted together; under grouped-query attention the heads are permuted in whole
groups (a key/value head with the r query heads that read it), so every query head still reads its
own key/value head; the channels inside a head are never permuted (rotary positions pair channel e
with e + dh/2).
"""

from __future__ import annotations

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment

from growlm.errors import GrowlmError
from growlm.growth.algebra import clone_weights, insertion_plan, mlp_width, pack, target_config, unpack
from growlm.growth.masked import GrownModel
from growlm.growth.msg import msg
from growlm.growth.registry import implements
from growlm.methods import OPERATORS
from growlm.shape import ModelShape

RES = ("ln1_w", "ln1_b", "o_b", "ln2_w", "ln2_b", "pr_b")  # block vectors on the residual axis


@implements("msg_members")
def msg_members(models, *, n_embd: int, n_layer: int, n_head: int | None = None, seed: int = 0,
                ramp_steps: int = 100, position: str = "interleave", init_std: float | None = None,
                cross: str = "random"):
    """msg of m_1 with m_2..m_n placed block-diagonally in the new capacity; exact (m_1) at step 0.

    Options: as msg (ramp_steps, position, init_std), and cross ("random" | "zero") for the weights
    between different members' blocks.
    """
    if cross not in ("random", "zero"):
        raise GrowlmError(f"msg_members: cross must be 'random' or 'zero', not {cross!r}")
    n = len(models)
    s = ModelShape.of(models[0])
    OPERATORS["msg_members"].check(s, n, n_embd, n_layer, n_head)
    grown = msg(models[:1], n_embd=n_embd, n_layer=n_layer, n_head=n_head, seed=seed,
                ramp_steps=max(1, int(ramp_steps)), position=position, init_std=init_std)
    core = grown.inner if isinstance(grown, GrownModel) else grown
    if n == 1:
        return grown if ramp_steps else core
    W = clone_weights(unpack(core))
    f0 = mlp_width(models[0].config, s.d) or 4 * s.d
    plan = insertion_plan(s.L, n_layer, position)
    d0, kv0 = s.d, s.g * s.dh
    R = [slice(j * d0, (j + 1) * d0) for j in range(n)]  # residual coordinates = query channels of member j
    KV = [slice(j * kv0, (j + 1) * kv0) for j in range(n)]  # its key/value channels
    F = [slice(j * f0, (j + 1) * f0) for j in range(n)]
    out_axis = {"q": R, "k": KV, "v": KV}

    def put(dst, index, value):
        if dst is not None:
            dst[index] = value

    with torch.no_grad():
        for j, member in enumerate(models[1:], start=1):
            M = unpack(member)
            r, f = R[j], F[j]
            W["wte"][:, r] = M["wte"]
            if W["wpe"] is not None:
                W["wpe"][: M["wpe"].shape[0], r] = M["wpe"]
            W["lnf_w"][r] = M["lnf_w"]
            put(W["lnf_b"], r, M["lnf_b"])
            if W["head"] is not None:
                W["head"][:, r] = M["head"]
            for t, p in enumerate(plan):
                if p is None:
                    continue
                B, src = W["blocks"][t], M["blocks"][p]
                for key in RES:
                    put(B[key], r, src[key])
                for key in ("q", "k", "v"):
                    c = out_axis[key][j]
                    B[f"{key}_w"][r, c] = src[f"{key}_w"]
                    put(B[f"{key}_b"], c, src[f"{key}_b"])
                B["o_w"][r, r] = src["o_w"]
                for key in ("fc", "gate"):
                    if B[f"{key}_w"] is not None:
                        B[f"{key}_w"][r, f] = src[f"{key}_w"]
                        put(B[f"{key}_b"], f, src[f"{key}_b"])
                B["pr_w"][f, r] = src["pr_w"]
        if cross == "zero":
            for t, p in enumerate(plan):
                if p is None:
                    continue
                B = W["blocks"][t]
                for a in range(n):
                    for b in range(n):
                        if a != b:
                            for key in ("q", "k", "v"):
                                B[f"{key}_w"][R[a], out_axis[key][b]] = 0
                            B["o_w"][R[a], R[b]] = 0
                            for key in ("fc_w", "gate_w"):
                                if B[key] is not None:
                                    B[key][R[a], F[b]] = 0
                            B["pr_w"][F[a], R[b]] = 0
    out = pack(W, target_config(core.config, n_embd=n_embd, n_layer=n_layer, n_head=ModelShape.of(core).h))
    if not isinstance(grown, GrownModel) or not ramp_steps:
        return out
    bufs = {k: getattr(grown, k) for k in ("res_new", "head_new", "mlp_new", "block_new")}
    return GrownModel(out, {**grown.spec, "kind": "msg_members", "ramp_steps": int(ramp_steps)}, bufs)


# ----------------------------------------------------------------------------------------------
# merge: weight matching and averaging
# ----------------------------------------------------------------------------------------------

def linear_assignment(cost: np.ndarray) -> np.ndarray:
    """The column assigned to each row of a square cost matrix, minimising the total cost: scipy's
    `linear_sum_assignment` (a shortest augmenting path method in C, Crouse 2016). A Hungarian method
    written in numpy here was 27-50 times slower at n 256-512 and took minutes at GPT-2's MLP width (3072
    units), which weight matching solves once per block and iteration."""
    cost = np.asarray(cost, dtype=np.float64)
    n = cost.shape[0]
    if cost.shape != (n, n):
        raise ValueError(f"linear_assignment needs a square matrix, not {cost.shape}")
    rows, cols = linear_sum_assignment(cost)
    out = np.empty(n, dtype=np.int64)
    out[rows] = cols
    return out


def _opt(t, index):
    return None if t is None else t[index]


def permute(W: dict, res: torch.Tensor, groups: list[torch.Tensor], mlp: list[torch.Tensor], dh: int,
            r: int = 1) -> dict:
    """The weights with residual coordinate i taken from coordinate res[i], head group p of block b
    from group groups[b][p] (a key/value head and the r query heads that read it; r = 1: a head) and
    MLP unit u of block b from unit mlp[b][u]: the same function."""
    out = {"wte": W["wte"][:, res], "wpe": _opt(W["wpe"], (slice(None), res)), "lnf_w": W["lnf_w"][res],
           "lnf_b": _opt(W["lnf_b"], res), "head": None if W["head"] is None else W["head"][:, res], "blocks": []}
    for B, gp, mp in zip(W["blocks"], groups, mlp):
        qc = (gp[:, None] * (r * dh) + torch.arange(r * dh)[None]).reshape(-1)  # query channels in the new order
        kc = (gp[:, None] * dh + torch.arange(dh)[None]).reshape(-1)  # key/value channels
        nb = {key: _opt(B[key], res) for key in RES}
        for key, ch in (("q", qc), ("k", kc), ("v", kc)):
            nb[f"{key}_w"] = B[f"{key}_w"][res][:, ch]
            nb[f"{key}_b"] = _opt(B[f"{key}_b"], ch)
        nb["o_w"] = B["o_w"][qc][:, res]
        for key in ("fc", "gate"):
            nb[f"{key}_w"] = None if B[f"{key}_w"] is None else B[f"{key}_w"][res][:, mp]
            nb[f"{key}_b"] = _opt(B[f"{key}_b"], mp)
        nb["pr_w"] = B["pr_w"][mp][:, res]
        out["blocks"].append(nb)
    return out


def _match(score: torch.Tensor) -> torch.Tensor:
    """The permutation maximising sum_i score[i, perm[i]]."""
    return torch.from_numpy(linear_assignment(-score.double().numpy()))


def _outer(a, b):
    return 0.0 if a is None else torch.outer(a, b)


def weight_matching(A: dict, B: dict, *, dh: int, r: int = 1, iterations: int = 5) -> tuple:
    """Permutations (residual, head groups per block, MLP units per block) that bring B's units onto A's."""
    d, L = A["wte"].shape[1], len(A["blocks"])
    f = A["blocks"][0]["fc_w"].shape[1]
    g = A["blocks"][0]["k_w"].shape[1] // dh  # key/value heads; each serves r query heads
    res = torch.arange(d)
    groups = [torch.arange(g) for _ in range(L)]
    mlp = [torch.arange(f) for _ in range(L)]
    for _ in range(max(1, int(iterations))):
        # the units inside each block, given the residual permutation
        Br = permute(B, res, [torch.arange(g)] * L, [torch.arange(f)] * L, dh, r)
        for b, (a, x) in enumerate(zip(A["blocks"], Br["blocks"])):
            score = a["fc_w"].T @ x["fc_w"] + _outer(a["fc_b"], x["fc_b"]) + a["pr_w"] @ x["pr_w"].T
            if a["gate_w"] is not None:
                score = score + a["gate_w"].T @ x["gate_w"] + _outer(a["gate_b"], x["gate_b"])
            mlp[b] = _match(score)
            score = torch.zeros(g, g, dtype=a["q_w"].dtype)
            for key, width in (("q", r * dh), ("k", dh), ("v", dh)):
                aw, xw = a[f"{key}_w"].reshape(d, g, width), x[f"{key}_w"].reshape(d, g, width)
                score += torch.einsum("igc,ikc->gk", aw, xw)
                if a[f"{key}_b"] is not None:
                    score += torch.einsum("gc,kc->gk", a[f"{key}_b"].reshape(g, width), x[f"{key}_b"].reshape(g, width))
            score += torch.einsum("gci,kci->gk", a["o_w"].reshape(g, r * dh, d), x["o_w"].reshape(g, r * dh, d))
            groups[b] = _match(score)
        # the residual coordinates, given the units inside the blocks
        Bu = permute(B, torch.arange(d), groups, mlp, dh, r)
        score = A["wte"].T @ Bu["wte"]
        if A["wpe"] is not None:
            score = score + A["wpe"].T @ Bu["wpe"]
        score = score + torch.outer(A["lnf_w"], Bu["lnf_w"]) + _outer(A["lnf_b"], Bu["lnf_b"])
        if A["head"] is not None:
            score += A["head"].T @ Bu["head"]
        for a, x in zip(A["blocks"], Bu["blocks"]):
            for key in RES:
                if a[key] is not None:
                    score += torch.outer(a[key], x[key])
            for key in ("q_w", "k_w", "v_w", "fc_w", "gate_w"):
                if a[key] is not None:
                    score += a[key] @ x[key].T
            for key in ("o_w", "pr_w"):
                score += a[key].T @ x[key]
        new_res = _match(score)
        if torch.equal(new_res, res):
            break
        res = new_res
    return res, groups, mlp


@implements("merge")
def merge(models, *, n_embd: int, n_layer: int, n_head: int | None = None, seed: int = 0,
          align: str = "weights", iterations: int = 5):
    """The members averaged into one model of their size, after weight matching (align="weights")
    or as they stand (align="none"). Not exact; merge of a model with a permuted copy of itself is
    the model.
    """
    if align not in ("weights", "none"):
        raise GrowlmError(f"merge: align must be 'weights' or 'none', not {align!r}")
    s = ModelShape.of(models[0])
    OPERATORS["merge"].check(s, len(models), n_embd, n_layer, n_head)
    A = unpack(models[0])
    aligned = [A]
    for m in models[1:]:
        B = unpack(m)
        if align == "weights":
            B = permute(B, *weight_matching(A, B, dh=s.dh, r=s.r, iterations=iterations), s.dh, s.r)
        aligned.append(B)
    k = len(aligned)
    W = {key: None if A[key] is None else sum(x[key] for x in aligned) / k for key in ("wte", "wpe", "lnf_w", "lnf_b",
                                                                                     "head")}
    W["blocks"] = [{key: None if A["blocks"][b][key] is None else sum(x["blocks"][b][key] for x in aligned) / k
                    for key in A["blocks"][b]} for b in range(s.L)]
    return pack(W, target_config(models[0].config, n_embd=s.d, n_layer=s.L, n_head=s.h))
