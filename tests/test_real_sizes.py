"""Growth at real sizes (issue 34, item 6): a float64 member grows into a float64-exact model, a
bfloat16/float32 member stays in its dtype, widths whose query heads are not whole groups of the
source's grouped-query attention are grown exactly by duplicating key/value heads, and the faster
width engine computes what the old one did (the noise split checked against the old formulation).

Exactness is compared in float64 with both models' norms in float64 (`float64_norms`: transformers'
Llama RMSNorm computes in float32 whatever the dtype), so the tolerance is 1e-10, not the 1e-5 that
float32 rounding needs in tests/test_families.py.
"""

from __future__ import annotations

import pytest
import torch

from conftest import perturbed
from growlm.errors import GrowlmError
from growlm.growth import GrownModel, grow
from growlm.growth.algebra import RMSNormFloat64, float64_norms
from growlm.growth.width import _Axis, copy_noise, kv_plan, regrouped_heads
from growlm.model import build_model
from growlm.shape import ModelShape, regrouped_r

V, T = 53, 12
EXACT = 1e-10


def llama(seed: int, d: int, L: int, *, r: int = 2, tied: bool = True, bias: bool = False, dtype=torch.float64):
    """A Llama member (head size 8, r query heads per key/value head) with perturbed norms and biases."""
    m = build_model(seed=seed, family="llama", n_embd=d, n_layer=L, vocab_size=V, n_positions=T, head_dim=8,
                    heads_per_kv=r, mlp_ratio=3, attention_bias=bias, tie_word_embeddings=tied)
    return perturbed(m, seed).to(dtype)


def tokens(seed: int = 0) -> torch.Tensor:
    return torch.randint(0, V, (3, T), generator=torch.Generator().manual_seed(seed))


def logits(model, x):
    with torch.no_grad():
        return model(input_ids=x).logits


def err(a, b) -> float:
    return float((a.double() - b.double()).abs().max())


def core(model):
    return model.inner if isinstance(model, GrownModel) else model


# -- precision ------------------------------------------------------------------------------------

@pytest.mark.parametrize("method,d1,L1,opts", [
    ("hyperclone", 64, 2, {}),
    ("lemon", 56, 2, {}),
    (["lemon", "zero_block"], 80, 4, {"noise": 0.3}),
    ("msg", 64, 3, {}),
    ("net2net", 96, 2, {"mapping": "cyclic"}),
    ("zero_block", 32, 4, {}),
])
def test_a_float64_member_grows_a_float64_exact_model(method, d1, L1, opts):
    src = llama(1, 32, 2)
    x = tokens()
    grown = grow([src], method, n_embd=d1, n_layer=L1, seed=3, **opts)
    assert {p.dtype for p in grown.parameters()} == {torch.float64}
    norms = [m for m in core(grown).modules() if "RMSNorm" in type(m).__name__]
    assert norms and all(type(m) is RMSNormFloat64 for m in norms)
    plain = err(logits(grown, x), logits(src, x))  # the member as transformers computes it: float32 norms
    float64_norms(src)
    assert err(logits(grown, x), logits(src, x)) < EXACT < plain


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("method", ["lemon", "msg", "hyperclone"])
def test_a_float32_or_bfloat16_member_stays_in_its_dtype(method, dtype):
    src = llama(1, 32, 2, dtype=dtype)
    grown = grow([src], method, n_embd=64, n_layer=2, seed=3)
    assert {p.dtype for p in grown.parameters()} == {dtype}
    assert not any(type(m) is RMSNormFloat64 for m in core(grown).modules())  # transformers' own norm
    x = tokens()
    tol = 1e-4 if dtype == torch.float32 else 0.5  # bfloat16: 8 bits of mantissa in every weight
    assert err(logits(grown, x), logits(src, x)) < tol


def test_float64_norms_change_nothing_below_float64():
    src = llama(1, 32, 2, dtype=torch.float32)
    x = tokens()
    before = logits(src, x)
    float64_norms(src)
    assert torch.equal(logits(src, x), before)


# -- key/value heads duplicated for widths that are not whole groups -----------------------------

REGROUP = [
    # (d0, r, d1, expected key/value heads): head size 8
    (48, 3, 64, 4),  # 6 heads on 2 key/value heads -> 8 heads: 2 query heads per key/value head
    (32, 2, 56, 7),  # 4 on 2 -> 7: one key/value head per query head
    (72, 3, 128, 8),  # 9 on 3 -> 16: 2 per key/value head
]


@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "attention_bias"])
@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
@pytest.mark.parametrize("method,L1", [("lemon", 2), (["lemon", "zero_block"], 3), ("msg", 3)],
                         ids=["lemon", "lemon+zero_block", "msg"])
@pytest.mark.parametrize("d0,r,d1,g1", REGROUP, ids=[f"{a}r{b}to{c}" for a, b, c, _ in REGROUP])
def test_a_width_that_breaks_the_groups_is_grown_exactly(d0, r, d1, g1, method, L1, tied, bias):
    src = float64_norms(llama(1, d0, 2, r=r, tied=tied, bias=bias))
    x = tokens(1)
    grown = grow([src], method, n_embd=d1, n_layer=L1, seed=3)
    s = ModelShape.of(core(grown))
    assert (s.d, s.L, s.dh, s.h, s.g) == (d1, L1, 8, d1 // 8, g1)
    assert err(logits(grown, x), logits(src, x)) < EXACT


@pytest.mark.parametrize("method", ["net2net", "fpi", "aki"])
def test_the_copy_operators_duplicate_key_value_heads_too(method):
    src = llama(1, 48, 2, r=3)
    grown = grow([src], method, n_embd=64, n_layer=2, seed=3)
    assert (ModelShape.of(grown).h, ModelShape.of(grown).g) == (8, 4)


def test_the_regrouped_plan_keeps_every_query_head_on_its_key_value_head():
    # 6 heads on 2 key/value heads -> 8: the groups' heads, then copies, 2 query heads per key/value head
    mem, src, r_new = regrouped_heads(1, 6, 3, 8)
    assert (src.tolist(), r_new) == ([0, 1, 2, 0, 3, 4, 5, 3], 2)
    kv_mem, kv_src = kv_plan(mem, src, 3, r_new)
    assert kv_src.tolist() == [0, 0, 1, 1]
    assert all(int(kv_src[j // r_new]) == int(src[j]) // 3 for j in range(8))
    # torch-free: the planner's shape has the same key/value heads
    assert regrouped_r(1, 6, 3, 8) == 2 and regrouped_r(1, 6, 3, 9) == 3 and regrouped_r(1, 4, 2, 7) == 1
    shape = ModelShape(n_embd=48, n_layer=2, n_head=6, vocab_size=V, family="llama", n_kv_head=2, n_inner=144)
    assert shape.resized(n_embd=64, n_layer=2, n_head=8).g == 4


@pytest.mark.parametrize("method,n,d1,match", [
    (["concat", "lemon"], 2, 112, "not whole groups of 3 query heads"),
    ("ligo", 1, 64, "not whole groups of 3 query heads"),
    ("hyperclone", 1, 64, "multiple of the source width"),
])
def test_operators_that_cannot_duplicate_key_value_heads_refuse_clearly(method, n, d1, match):
    members = [llama(i, 48, 2, r=3) for i in range(n)]
    with pytest.raises(GrowlmError, match=match):
        grow(members, method, n_embd=d1, n_layer=2, seed=0)


# -- the width engine's noise: the same numbers as the old formulation ----------------------------

def _old_copy_noise(ax: _Axis, cols: int, std: float, mode: str, gen: torch.Generator, dtype) -> torch.Tensor:
    """copy_noise as it was before the engine was made fast (index_add_ over the whole matrix)."""
    A = ax.mem.numel()
    if mode == "centered":
        N = torch.randn(A, cols, generator=gen, dtype=dtype) * std
        K = int(ax.key.max()) + 1
        mean = torch.zeros(K, cols, dtype=dtype).index_add_(0, ax.key, N)
        mean = mean / torch.bincount(ax.key, minlength=K).clamp(min=1).to(dtype)[:, None]
        N = N - mean[ax.key]
        N[(ax.count == 1) | ax.residue] = 0.0
        return N
    raise AssertionError(mode)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_copy_noise_is_bitwise_the_old_one(dtype):
    g = torch.Generator().manual_seed(0)
    for trial in range(20):
        size = int(torch.randint(3, 40, (1,), generator=g))
        A = size + int(torch.randint(0, 3 * size, (1,), generator=g))
        mem = torch.randint(0, 2, (A,), generator=g)
        src = torch.where(torch.rand(A, generator=g) < 0.15, -1, torch.randint(0, size, (A,), generator=g))
        ax = _Axis.make(mem, src, size)
        cols = int(torch.randint(1, 50, (1,), generator=g))
        g_new, g_old = torch.Generator().manual_seed(trial), torch.Generator().manual_seed(trial)
        new = copy_noise(ax, cols, 0.3, "centered", g_new, dtype)
        old = _old_copy_noise(ax, cols, 0.3, "centered", g_old, dtype)
        assert torch.equal(new, old) and torch.equal(g_new.get_state(), g_old.get_state())
