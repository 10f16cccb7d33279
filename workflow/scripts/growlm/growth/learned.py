"""Learned linear growth operators: LiGO (Wang et al., ICLR 2023) and Mango (Pan et al., NeurIPS 2023).

Both express every weight of the grown model as a linear function of the source weights, train
that function for a few steps on the LM loss of the grown model, then materialise it into a plain
GPT2LMHeadModel.

One implementation, a tensor ring of bond rank R over the modes (input units, output units, depth):
for a weight kind with source stack M[j, i, o] (j = source block of any member: J = n * L0),

    W'[l, I, O] = sum_{r,s,t} S_in[r, I, i, s] S_out[s, O, o, t] S_depth[t, l, j, r] M[j, i, o]

* rank 1 (`ligo`): S_in, S_out, S_depth are plain matrices, i.e. LiGO's width maps (applied on
  both sides of each matrix) and depth mixing W'_l = sum_j w_lj W_j;
* rank R > 1 (`mango`, option `rank`): Mango's multi-linear operator as a tensor ring (the
  weight-kind core S_B of the paper is the identity here: each weight kind has its own depth core;
  the width cores are shared as below).

Sharing (as LiGO's "bert2BERT-style tying"): one residual input core (all readers: Q/K/V, c_fc,
an untied lm_head) and one residual output core (all writers, embeddings, LN parameters) for the
whole model; separate head cores for the outputs of Q, K, V and the input of the attention c_proj
(acting on whole heads, Kronecker with the identity on the head size); MLP cores for c_fc's outputs
and c_proj's inputs acting on groups of `head_dim` units; one depth core per weight kind. Vectors
(biases, LN) use the output core with the ring closed through the identity; embeddings, the final
LN and an untied head use the trace of the residual cores and a learned member mixture.

Initialisation: the maps of an exact copy (HyperCloning/LEMON layout: tiled copies, readers split
1/count, residue coordinates = mean for writers and 0 for readers), depth = members' blocks in turn
(l -> member (l // L0) mod n, block l mod L0: G_stack for one member), the final LN (tied head)
divided by the copy count; plus Gaussian noise `init_noise` on every core. With one member,
d1 = k d0, L1 = L0 and init_noise = 0 the initial operator reproduces the source exactly; in general
it is not function-preserving (learned; LiGO's own init is not either).

Llama family: the gated MLP's gate shares the MLP cores of its up projection (a unit is gate and up
column with down row); the key/value projections have their own head cores over the g key/value
heads (initialised as the copies of the query heads' groups); under RMSNorm the residue
coordinates of the initial map hold 0, not the mean (see growlm.growth.lemon); there are no
position embeddings to map.

Training: AdamW (lr `lr`) on the operator's parameters for `steps` steps on `batches` (an iterable
of LongTensor [B, T] token batches, cycled), with the grown model's LM loss. The training cost is
recorded in `model.growlm_growth_flops`: steps x (the project's per-token training FLOPs of the
grown model x tokens per batch + the measured FLOPs of materialising the weights, forward and
backward).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.func import functional_call
from torch.utils.flop_counter import FlopCounterMode

from growlm.errors import GrowlmError
from growlm.loading import materialise_buffers
from growlm.flops import model_train_flops_per_token
from growlm.growth.algebra import (BLOCK_KEYS, empty_model, generator, load_into, mlp_width, state_dict_of,
                                  target_config, unpack)
from growlm.growth.registry import implements
from growlm.growth.width import kv_plan, tile_plan
from growlm.methods import check_heads
from growlm.shape import ModelShape

# (input-axis core, output-axis core) of every block weight; None = no input axis (a vector)
_ROLES = {
    "ln1_w": (None, "res_out"), "ln1_b": (None, "res_out"), "ln2_w": (None, "res_out"), "ln2_b": (None, "res_out"),
    "q_w": ("res_in", "q"), "k_w": ("res_in", "k"), "v_w": ("res_in", "v"),
    "q_b": (None, "q"), "k_b": (None, "k"), "v_b": (None, "v"),
    "o_w": ("o_in", "res_out"), "o_b": (None, "res_out"),
    "fc_w": ("res_in", "fc_out"), "fc_b": (None, "fc_out"),
    "gate_w": ("res_in", "fc_out"), "gate_b": (None, "fc_out"),  # a gated MLP's unit: gate and up together
    "pr_w": ("pr_in", "res_out"), "pr_b": (None, "res_out"),
}


def _one_hot(src: torch.Tensor, size: int) -> torch.Tensor:
    return torch.nn.functional.one_hot(src.clamp(min=0), size).double() * (src >= 0).double()[:, None]


class RingGrowth(nn.Module):
    """The trainable operator; `materialise()` gives the grown model's state dict (differentiable)."""

    def __init__(self, members, *, n_embd: int, n_layer: int, rank: int, init_noise: float, seed: int):
        super().__init__()
        s = ModelShape.of(members[0])
        self.s, self.n, self.R = s, len(members), int(rank)
        self.d1, self.L1 = n_embd, n_layer
        self.h1 = n_embd // s.dh
        self.f1 = mlp_width(members[0].config, n_embd) or 4 * n_embd
        g = s.dh  # MLP group size
        if s.f % g or self.f1 % g:
            raise GrowlmError(f"MLP widths {s.f}, {self.f1} are not multiples of the head size {g}")
        self.g = g
        Ws = [unpack(m) for m in members]
        dtype = Ws[0]["wte"].dtype
        J = self.n * s.L
        self.keys = [key for key in BLOCK_KEYS if Ws[0]["blocks"][0][key] is not None]  # what the family has
        for key in self.keys:
            self.register_buffer("src_" + key, torch.stack([W["blocks"][l][key] for W in Ws for l in range(s.L)]))
        self.emb_keys = [key for key in ("wte", "wpe", "lnf_w", "lnf_b") if Ws[0][key] is not None]
        for key in self.emb_keys:
            self.register_buffer("emb_" + key, torch.stack([W[key] for W in Ws]))
        self.tied = Ws[0]["head"] is None
        if not self.tied:
            self.register_buffer("emb_head", torch.stack([W["head"] for W in Ws]))
        gen = generator(seed)
        plan = tile_plan(1, s.d, s.h, s.f // g, n_embd, self.h1, self.f1 // g, r=s.r)
        _, kv_src = kv_plan(plan.head_mem, plan.head_src, s.r)

        def split(src, size):
            oh = _one_hot(src, size)
            cnt = oh.sum(0).clamp(min=1)
            return oh / cnt[None, :]

        res_out = _one_hot(plan.res_src, s.d)
        # residue coordinate = mean (LayerNorm, LEMON) or 0 (RMSNorm)
        res_out[plan.res_src < 0] = 1.0 / s.d if s.norm == "layernorm" else 0.0
        maps = {"res_out": res_out, "res_in": split(plan.res_src, s.d),
                "q": _one_hot(plan.head_src, s.h), "k": _one_hot(kv_src, s.g),
                "v": _one_hot(kv_src, s.g), "o_in": split(plan.head_src, s.h),
                "fc_out": _one_hot(plan.mlp_src, s.f // g), "pr_in": split(plan.mlp_src, s.f // g)}
        R = self.R
        eye = torch.eye(R, dtype=torch.float64)

        def core(m, scale=1.0):
            c = eye[:, None, None, :] * m[None, :, :, None] * scale
            if init_noise > 0:
                c = c + torch.randn(c.shape, generator=gen, dtype=torch.float64) * init_noise * float(m.abs().max())
            return nn.Parameter(c.to(dtype))

        self.cores = nn.ParameterDict({name: core(m) for name, m in maps.items()})
        src_of = [((l // s.L) % self.n) * s.L + l % s.L for l in range(n_layer)]
        w0 = _one_hot(torch.tensor(src_of), J)
        self.depth = nn.ParameterDict({key: core(w0, 1.0 / R) for key in self.keys})
        mix = torch.zeros(self.n, dtype=torch.float64)
        mix[0] = 1.0
        self.mix = nn.Parameter(mix.to(dtype))
        counts = torch.bincount(plan.res_src.clamp(min=0), minlength=s.d).double()[plan.res_src.clamp(min=0)]
        self.lnf_scale = nn.Parameter((1.0 / counts if self.tied else torch.ones(n_embd, dtype=torch.float64)).to(dtype))

    # -- contractions ------------------------------------------------------------------------------
    def _group(self, name: str) -> int:
        return {"res_out": 1, "res_in": 1, "q": self.s.dh, "k": self.s.dh, "v": self.s.dh,
                "o_in": self.s.dh, "fc_out": self.g, "pr_in": self.g}[name]

    def _weight(self, key: str) -> torch.Tensor:
        M = getattr(self, "src_" + key)  # (J, i0, o0) or (J, o0)
        SL = self.depth[key]  # (R, L1, J, R): [t, l, j, r]
        cin, cout = _ROLES[key]
        R, L1 = self.R, self.L1
        if cin is None:
            X = torch.einsum("tljr,jo->trlo", SL, M)  # ring closed through the identity: s = r
            go = self._group(cout)
            X = X.reshape(R, R, L1, -1, go)
            Z = torch.einsum("sOot,tslog->lOg", self.cores[cout], X)
            return Z.reshape(L1, -1)
        X = torch.einsum("tljr,jio->trlio", SL, M)
        gi = self._group(cin)
        i0, o0 = M.shape[1], M.shape[2]
        X = X.reshape(R, R, L1, i0 // gi, gi, o0)
        Y = torch.einsum("rIis,trligo->tslIgo", self.cores[cin], X)
        Y = Y.reshape(R, R, L1, -1, o0)
        go = self._group(cout)
        Y = Y.reshape(R, R, L1, Y.shape[3], o0 // go, go)
        Z = torch.einsum("sOot,tsliog->liOg", self.cores[cout], Y)
        return Z.reshape(L1, Z.shape[1], -1)

    def _trace(self, name: str) -> torch.Tensor:
        return torch.einsum("rIir->Ii", self.cores[name]) / self.R

    def materialise(self, config) -> dict[str, torch.Tensor]:
        """The grown model's state dict (the family's names for `config`), differentiable."""
        W = {key: self._weight(key) for key in self.keys}
        A_out, A_in = self._trace("res_out"), self._trace("res_in")
        mixed = {k: torch.einsum("m,m...->...", self.mix, getattr(self, "emb_" + k)) for k in self.emb_keys}
        form = {"wte": mixed["wte"] @ A_out.T, "wpe": mixed["wpe"] @ A_out.T if "wpe" in mixed else None,
                "lnf_w": (A_out @ mixed["lnf_w"]) * self.lnf_scale,
                "lnf_b": (A_out @ mixed["lnf_b"]) * self.lnf_scale if "lnf_b" in mixed else None,
                "head": None if self.tied else torch.einsum("m,mvd->vd", self.mix, self.emb_head) @ A_in.T,
                "blocks": [{key: W[key][l] if key in W else None for key in BLOCK_KEYS} for l in range(self.L1)]}
        return state_dict_of(form, config)


def _learned(models, *, n_embd, n_layer, n_head, seed, rank, steps, batches, lr, init_noise, device):
    s = ModelShape.of(models[0])
    check_heads(s, n_embd, n_head, "learned growth")
    if rank < 1:
        raise GrowlmError(f"rank must be >= 1, not {rank}")
    if steps < 0:
        raise GrowlmError(f"steps must be >= 0, not {steps}")
    data = []
    if steps > 0:
        if batches is None:
            raise GrowlmError("a learned growth operator with steps > 0 needs the option batches "
                              "(an iterable of LongTensor [B, T] token batches)")
        for b in batches:
            data.append(torch.as_tensor(b, dtype=torch.long))
            if len(data) >= steps:
                break
        if not data:
            raise GrowlmError("the option batches is empty")
        for b in data:
            if b.dim() != 2 or b.shape[1] > s.T or int(b.max()) >= s.V or int(b.min()) < 0:
                raise GrowlmError(f"batches must be LongTensor [B, T<={s.T}] of token ids < {s.V}; got {tuple(b.shape)}")
    h1 = n_embd // s.dh
    config = target_config(models[0].config, n_embd=n_embd, n_layer=n_layer, n_head=h1)
    dev = torch.device(device) if device else next(models[0].parameters()).device
    with torch.enable_grad():
        op = RingGrowth(models, n_embd=n_embd, n_layer=n_layer, rank=rank, init_noise=float(init_noise),
                        seed=seed).to(dev)
        template = empty_model(config)
        if config.tie_word_embeddings:
            template.lm_head.weight = template.get_input_embeddings().weight
        materialise_buffers(template)  # rotary frequencies (llama): from the config, not the operator
        for mod in template.modules():  # those buffers go where the operator's weights are
            for key, buf in mod._buffers.items():
                if buf is not None and buf.device.type != "meta":
                    mod._buffers[key] = buf.to(dev)
        template.train()
        flops = 0
        if steps > 0:
            opt = torch.optim.AdamW(op.parameters(), lr=float(lr), weight_decay=0.0)
            with FlopCounterMode(display=False) as counter:
                sd = op.materialise(config)
                sum(v.sum() for v in sd.values()).backward()
            mat_flops = int(counter.get_total_flops())
            opt.zero_grad(set_to_none=True)
            per_token = model_train_flops_per_token(config, data[0].shape[1])
            for step in range(steps):
                x = data[step % len(data)].to(dev)
                out = functional_call(template, op.materialise(config), args=(), kwargs={"input_ids": x, "labels": x})
                if not torch.isfinite(out.loss):
                    raise GrowlmError(f"learned growth: loss is {float(out.loss)} at operator step {step + 1}; "
                                      f"lower the option lr")
                out.loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                flops += per_token * x.numel() + mat_flops
        with torch.no_grad():
            sd = {k: v.detach().to("cpu") for k, v in op.materialise(config).items()}
    model = load_into(empty_model(config), sd)
    model.growlm_growth_flops = int(flops)
    return model


@implements("ligo")
def ligo(models, *, n_embd: int, n_layer: int, n_head: int | None = None, seed: int = 0, steps: int = 100,
         batches=None, lr: float = 1e-3, init_noise: float = 0.01, device: str | None = None):
    """LiGO: learned width maps and depth mixing (rank-1 ring), trained `steps` steps, then materialised.

    All n members are depth-mixing sources. Options: steps (default 100), batches (iterable of
    LongTensor [B, T]; required when steps > 0), lr (AdamW, default 1e-3), init_noise (default 0.01,
    relative), device (default: the members' device). Records model.growlm_growth_flops.
    """
    return _learned(models, n_embd=n_embd, n_layer=n_layer, n_head=n_head, seed=seed, rank=1, steps=steps,
                    batches=batches, lr=lr, init_noise=init_noise, device=device)


@implements("mango")
def mango(models, *, n_embd: int, n_layer: int, n_head: int | None = None, seed: int = 0, rank: int = 2,
          steps: int = 100, batches=None, lr: float = 1e-3, init_noise: float = 0.01, device: str | None = None):
    """Mango: the multi-linear growth operator as a tensor ring of bond rank `rank` (rank 1 = LiGO).

    Options as ligo, plus rank (default 2). Records model.growlm_growth_flops.
    """
    return _learned(models, n_embd=n_embd, n_layer=n_layer, n_head=n_head, seed=seed, rank=rank, steps=steps,
                    batches=batches, lr=lr, init_noise=init_noise, device=device)
