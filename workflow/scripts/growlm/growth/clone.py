"""HyperCloning: exact width growth by an integer factor k = d1 / d0 (arXiv 2409.12903).

Every unit is tiled k times: residual coordinate i of the grown model copies coordinate i mod d0,
head j copies head j mod h0 (the head size is kept, so there are k*h0 heads), MLP unit u copies
u mod f0. Q/K/V are split out of the fused `c_attn` per head, tiled, and re-packed. Readers'
input rows (Conv1D orientation) are divided by k; embeddings (wte, wpe), biases and LN gamma/beta
are tiled without division. With a tied unembedding the final LN gamma and beta are divided by k
(so plain tying survives, `save_pretrained` works); an untied lm_head has its columns tiled and
divided by k instead.

Symmetry breaking (`noise` > 0): for every pair of copies (2p, 2p+1) of an input row, +N is added
to the first and -N to the second (N Gaussian with std = noise x std of the source matrix); since
the two inputs are equal copies the noise cancels exactly (odd k leaves the last copy clean). The
tied unembedding (= wte, a writer) gets no noise.

Llama family: RMSNorm of k tiled copies is the source's (the mean square of a tiled vector is the
vector's), so the gains are tiled as LayerNorm's are and nothing else changes; key/value heads are
tiled with their query heads (head j copies head j mod h0, whose group j // r copies group
(j mod h0) // r = (j // r) mod g0: every query head reads the copy of its source's key/value head,
the query heads per key/value head kept); the gated MLP's unit u is gate and up column u with down
row u, tiled together; rotary positions act per head, whose size is kept.
"""

from __future__ import annotations

from growlm.errors import GrowlmError
from growlm.growth.algebra import generator, pack, target_config, unpack
from growlm.growth.registry import implements
from growlm.growth.width import WidthEngine, single_tile_plan
from growlm.methods import OPERATORS
from growlm.shape import ModelShape


@implements("hyperclone")
def hyperclone(models, *, n_embd: int, n_layer: int, n_head: int | None = None, seed: int = 0,
               noise: float = 0.316):
    """Exact width cloning by k = d1/d0 (HyperCloning). Uses the first member.

    Options: noise (float >= 0, default 0.316, the paper's 10 dB signal-to-noise ratio: a std of
    10^(-10/20) of the signal's): std of the cancelling +N/-N pair noise, relative to each source
    matrix's std; 0 gives plain copies, which stay twins unless training breaks the symmetry.
    """
    if noise < 0:
        raise GrowlmError(f"hyperclone: noise must be >= 0, not {noise}")
    src = models[0]
    s = ModelShape.of(src)
    OPERATORS["hyperclone"].check(s, 1, n_embd, n_layer, n_head)
    k = n_embd // s.d
    plan = single_tile_plan(s.d, s.h, s.f, n_embd, s.h * k, s.f * k)
    W = WidthEngine([unpack(src)], s, plan, gen=generator(seed), noise=float(noise), noise_mode="pairs").grow()
    return pack(W, target_config(src.config, n_embd=n_embd, n_layer=s.L, n_head=s.h * k))
