"""GrownModel: a model with growth masks and grouped norms, ramped into a plain model of its family.

Used by `msg` (Masked Structural Growth), `msg_members` and `concat` (n members side by side). It
wraps a plain model of either family (`.inner`: a `GPT2LMHeadModel` or `LlamaForCausalLM`, the
weights the optimizer trains) and evaluates it with three ramps, each 0 at step 0 and 1 when done:

* masks (MSG): new residual coordinates, heads, MLP units and blocks have their outputs multiplied
  by c_mask (embeddings and writers on new coordinates, head outputs before c_proj, MLP activations,
  LN outputs on new coordinates, and the residual branches of new blocks:
  x <- x + c * Block(x)); the norm's statistics are weighted by the residual mask (LayerNorm: the
  mean and variance; RMSNorm: the mean square), so at c=0 the old coordinates see exactly the source
  model whatever the new weights are.
* cross (concat, cross="random"): weights connecting different members' units are multiplied by
  c_cross.
* ln (concat): the norm's statistics are computed per member group and mixed into the full-width
  ones: mu_c = (1-c) mu_group + c mu_all, var_c = (1-c) var_group + c var_all (RMSNorm: the mean
  square alike), eps_c = (1-c) eps_group + c eps (each group may have its own eps after padding).

The masks and norms are written once here; the family (`growlm.families`) computes a block's
attention and MLP from its live modules (GPT-2's fused c_attn, Llama's rotary positions and
grouped-query attention, a gated MLP), with the head and MLP-unit masks and the cross-member
factors applied where they belong.

Protocol: `growth_step(step)` (the training loop calls it before every step) sets the ramps;
`ramp_done` is True once every ramp is at 1, and then the module computes exactly its inner model
(it delegates to it); `stepping_module` is the module a training step should run (this one while
a ramp runs, the inner model after); `to_plain()` returns that inner model (sharing the
parameters), and raises GrowlmError before the ramps are done. `config` is the inner model's config
(FLOPs etc.).

Compiled once: the ramps' values reach the forward pass only as the buffer `ramp_values` (on the
model's device, written in place by `growth_step`), and which terms the forward computes depends
only on the model's structure (which buffers it has, `spec["cross_masked"]`), never on a ramp's
value. So torch.compile traces `masked_forward` once for the whole ramp: a Python float read in the
forward would be a constant to dynamo, guarded on its value, and every step of the ramp would
compile the model again (`tests/test_compile.py` checks every operator and schedule for that). The
buffer holds each ramp c and 1 - c, computed in double precision and rounded once, the very values
the arithmetic used when they were Python floats, so the eager results are unchanged to the bit.
`export()` / `GrownModel.restore()` give a JSON-able description + a flat tensor dict (no pickle),
used by `growlm.growth.save_grown` / `load_grown`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers.modeling_outputs import CausalLMOutput

from growlm.errors import GrowlmError
from growlm.families import FAMILY, family_of
from growlm.family_specs import DEFAULT_FAMILY
from growlm.growth.algebra import empty_model, load_into, norm_eps, pack, ramp, target_config, unpack, with_blocks
from growlm.shape import ModelShape

MASK_KEYS = ("res_new", "head_new", "mlp_new", "block_new")
GROUP_KEYS = ("res_group", "head_group", "mlp_group", "group_eps")


class GrownModel(nn.Module):
    def __init__(self, inner, spec: dict, buffers: dict[str, torch.Tensor], step: int = 0):
        super().__init__()
        self.inner = inner
        self.family = family_of(inner)
        self._shape = ModelShape.of(inner)
        self.spec = {"ramp_steps": 0, "ln_ramp_steps": 0, "cross_masked": False, "kind": "grown", **spec}
        self.has_masks = all(k in buffers for k in MASK_KEYS)
        self.has_groups = all(k in buffers for k in GROUP_KEYS)
        if not self.has_masks and not self.has_groups:
            raise ValueError("GrownModel needs mask buffers or group buffers")
        for k, v in buffers.items():
            self.register_buffer(k, v.clone())
        if self.has_groups:
            G = int(self.group_eps.numel())
            self.register_buffer("_onehot", F.one_hot(self.res_group, G).to(self.inner.dtype), persistent=False)
            if self.spec["cross_masked"]:  # 1 where a weight connects two members' units (fixed by the structure)
                for key, between in self._between().items():
                    self.register_buffer(f"_between_{key}", between, persistent=False)
        # [c_mask, 1 - c_mask, c_cross, 1 - c_cross, c_ln, 1 - c_ln, c_ln * eps]: what the forward pass reads
        # of the ramps (see the module docstring); not part of the state dict (the step sets it)
        self.register_buffer("ramp_values", torch.zeros(7, dtype=torch.float32, device=self.inner.device),
                             persistent=False)
        # which masks can differ from 1 (a mask with no new unit is 1 at every step): fixed by the structure,
        # so the forward computes only those (concat followed by a depth operator masks new blocks only)
        self._masked = {k: self.has_masks and bool(getattr(self, k).any()) for k in MASK_KEYS}
        self.step = 0
        self.growth_step(step)

    # -- protocol ---------------------------------------------------------------------------------
    @property
    def config(self):
        return self.inner.config

    @property
    def shape(self) -> ModelShape:
        return self._shape

    def growth_step(self, step: int) -> None:
        self.step = int(step)
        self.c_mask = ramp(step, self.spec["ramp_steps"]) if self.has_masks else 1.0
        self.c_cross = ramp(step, self.spec["ramp_steps"]) if self.spec["cross_masked"] else 1.0
        self.c_ln = ramp(step, self.spec["ln_ramp_steps"]) if self.has_groups else 1.0
        # a bool, not the floats: the forward's one branch on the ramps (dynamo guards on it, which changes once)
        self._done = self.c_mask >= 1.0 and self.c_cross >= 1.0 and self.c_ln >= 1.0
        values = [v for c in (self.c_mask, self.c_cross, self.c_ln) for v in (c, 1.0 - c)]  # in double, then rounded
        values.append(self.c_ln * norm_eps(self.config))
        dtype = torch.float64 if self.inner.dtype == torch.float64 else torch.float32  # exact in a float64 model
        if self.ramp_values.dtype != dtype:
            self.ramp_values = self.ramp_values.to(dtype)
        with torch.no_grad():
            self.ramp_values.copy_(torch.tensor(values, dtype=dtype))

    def set_ramps(self, *, ramp_steps: int | None = None, ln_ramp_steps: int | None = None) -> None:
        """Set the ramp lengths (refinement steps); the refinement does, to fit its own length."""
        if ramp_steps is not None:
            self.spec["ramp_steps"] = int(ramp_steps)
        if ln_ramp_steps is not None:
            self.spec["ln_ramp_steps"] = int(ln_ramp_steps)
        self.growth_step(self.step)

    @property
    def ramp_done(self) -> bool:
        return self._done

    @property
    def stepping_module(self) -> nn.Module:
        """The module a training step runs: this one while a ramp runs, the inner model once they are done
        (the same function; a compiled training loop compiles the inner model once, and this one once too
        with `train.compile_ramps`, else runs it eagerly: growlm.train.Run.step_model)."""
        return self.inner if self.ramp_done else self

    def to_plain(self):
        if not self.ramp_done:
            raise GrowlmError(
                f"the {self.spec['kind']} growth ramps are not complete at step {self.step} "
                f"(ramp_steps={self.spec['ramp_steps']}, ln_ramp_steps={self.spec['ln_ramp_steps']}); "
                f"train at least that many steps before converting to a plain {self.family.name} model")
        return self.inner

    @property
    def dtype(self) -> torch.dtype:
        return self.inner.dtype

    # -- forward ----------------------------------------------------------------------------------
    def forward(self, input_ids: torch.LongTensor, labels: torch.LongTensor | None = None,
                attention_mask: torch.Tensor | None = None, **kwargs):
        if self.ramp_done:
            return self.inner(input_ids=input_ids, labels=labels, attention_mask=attention_mask, **kwargs)
        return self.masked_forward(input_ids, labels=labels, attention_mask=attention_mask)

    def masked_forward(self, input_ids: torch.LongTensor, labels: torch.LongTensor | None = None,
                       attention_mask: torch.Tensor | None = None):
        """The forward pass with the current ramps (at all ramps = 1 it equals `self.inner`)."""
        if attention_mask is not None and not bool(attention_mask.all()):
            raise GrowlmError("a grown model supports only full (causal) attention before its ramps are done")
        logits = self.family.logits(self.inner, self.masked_hidden(input_ids))
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(),
                                   labels[:, 1:].reshape(-1), ignore_index=-100)
        return CausalLMOutput(loss=loss, logits=logits)

    def fused_loss_inputs(self, input_ids: torch.LongTensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(the final hidden states, the LM head's weight) for `growlm.loss.lm_loss`'s fused head and loss
        (on a CPU, as M_0's plain model gets it), or None when the head is not a plain bias-free matrix."""
        head = getattr(self.inner, "lm_head", None)
        if head is None or getattr(head, "bias", None) is not None or head.weight.dtype != torch.float32:
            return None
        return self.masked_hidden(input_ids), head.weight

    def masked_hidden(self, input_ids: torch.LongTensor) -> torch.Tensor:
        """The final norm's output with the current ramps: what the LM head reads."""
        fam, model = self.family, self.inner
        keep = self.ramp_values[1]  # 1 - c_mask
        on = self._masked
        m_res = 1.0 - keep * self.res_new if on["res_new"] else None
        m_head = 1.0 - keep * self.head_new if on["head_new"] else None
        m_mlp = 1.0 - keep * self.mlp_new if on["mlp_new"] else None
        m_block = 1.0 - keep * self.block_new if on["block_new"] else None
        x = fam.embed(model, input_ids)
        if m_res is not None:
            x = x * m_res.to(x.dtype)
        cross = self._cross_factors() if self.spec["cross_masked"] else None  # factors of 1 once c_cross is 1
        for l, blk in enumerate(fam.blocks(model)):
            mb = m_block[l].to(x.dtype) if m_block is not None else 1.0
            norm1, norm2 = fam.norms(blk)
            o = fam.attention(model, l, self._ln(x, norm1, m_res), cross=cross, m_head=m_head)
            if m_res is not None:
                o = o * m_res.to(o.dtype)
            x = x + mb * o
            p = fam.mlp(model, l, self._ln(x, norm2, m_res), cross=cross, m_mlp=m_mlp)
            if m_res is not None:
                p = p * m_res.to(p.dtype)
            x = x + mb * p
        return self._ln(x, fam.final_norm(model), m_res)

    def _ln(self, x: torch.Tensor, ln: nn.Module, m_res: torch.Tensor | None) -> torch.Tensor:
        """The family's norm (LayerNorm, or RMSNorm: no mean, no bias) with mask-weighted statistics,
        per member group faded into full width (see the module docstring)."""
        rms = self.shape.norm == "rmsnorm"
        xf = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
        w = None if m_res is None else m_res.to(xf.dtype)
        eps = norm_eps(self.config)
        # with groups both statistics are computed at every step of the ramp (at c_ln = 0 the full-width
        # ones get weight 0, at 1 the groups' do: exact), so the computation never depends on c_ln's value
        if w is None:
            mu = torch.zeros_like(xf[..., :1]) if rms else xf.mean(-1, keepdim=True)
            var = (xf - mu).pow(2).mean(-1, keepdim=True)
        else:
            tot = w.sum()
            mu = torch.zeros_like(xf[..., :1]) if rms else (xf * w).sum(-1, keepdim=True) / tot
            var = ((xf - mu).pow(2) * w).sum(-1, keepdim=True) / tot
        if self.has_groups:
            G = self._onehot.to(xf.dtype)
            wG = G if w is None else G * w[:, None]
            cnt = wG.sum(0)
            # back to every coordinate of its group by a matmul with the one-hot map (exact: one term each),
            # not by indexing, whose backward (index_put) costs a CPU step more than the statistics
            spread = G.t()
            mu_g = torch.zeros_like(xf) if rms else ((xf @ wG) / cnt) @ spread
            var_g = (((xf - mu_g).pow(2) @ wG) / cnt) @ spread
            eps_g = self.group_eps.to(xf.dtype)[self.res_group]
            c, keep, c_eps = self.ramp_values[4], self.ramp_values[5], self.ramp_values[6]  # c_ln, 1 - c_ln, c_ln eps
            mu, var, eps = keep * mu_g + c * mu, keep * var_g + c * var, keep * eps_g + c_eps
        y = (xf - mu) / torch.sqrt(var + eps) * ln.weight.to(xf.dtype)
        if getattr(ln, "bias", None) is not None:
            y = y + ln.bias.to(xf.dtype)
        if w is not None:
            y = y * w
        return y.to(x.dtype)

    CROSS_KEYS = ("q", "k", "v", "o", "fc", "pr")

    def _between(self) -> dict[str, torch.Tensor]:
        """1 where a weight connects units of different members, 0 within a member, per matrix of the weight
        form ((in, out) orientation): q (residual -> query channels), k and v (residual -> key/value
        channels), o, fc (and a gated MLP's gate), pr. Fixed by the structure: computed once."""
        s = self.shape
        hc = self.head_group.repeat_interleave(s.dh)
        kvc = self.head_group[::s.r].repeat_interleave(s.dh)

        def f(a, b):
            return (a[:, None] != b[None, :]).to(self.inner.dtype)

        return {"q": f(self.res_group, hc), "k": f(self.res_group, kvc), "v": f(self.res_group, kvc),
                "o": f(hc, self.res_group), "fc": f(self.res_group, self.mlp_group), "pr": f(self.mlp_group, self.res_group)}

    def _cross_factors(self) -> dict[str, torch.Tensor]:
        """1 on weights within a member, c_cross on weights between members (`_between`)."""
        keep = self.ramp_values[3]  # 1 - c_cross
        return {key: 1.0 - keep * getattr(self, f"_between_{key}") for key in self.CROSS_KEYS}

    # -- structure edits (depth operators after concat) ---------------------------------------------
    def with_blocks(self, blocks: list[dict], block_map: list[int | None]) -> "GrownModel":
        s = self.shape
        W = with_blocks(unpack(self.inner), blocks)
        core = pack(W, target_config(self.config, n_embd=s.d, n_layer=len(blocks), n_head=s.h, n_inner=s.n_inner))
        bufs = {k: getattr(self, k) for k in MASK_KEYS + GROUP_KEYS if hasattr(self, k)}
        if self.has_masks:
            old = self.block_new
            bufs["block_new"] = torch.stack([old[j] if j is not None else torch.zeros_like(old[0])
                                             for j in block_map])
        return GrownModel(core, self.spec, bufs, self.step)

    # -- serialisation ----------------------------------------------------------------------------
    def export(self) -> tuple[dict, dict[str, torch.Tensor]]:
        tensors = {}
        tied = bool(self.config.tie_word_embeddings)
        for k, v in self.inner.state_dict().items():
            if tied and k == "lm_head.weight":
                continue
            tensors["inner." + k] = v.detach().contiguous().cpu()
        for k in MASK_KEYS + GROUP_KEYS:
            if hasattr(self, k):
                tensors["growlm." + k] = getattr(self, k).detach().contiguous().cpu()
        meta = {"class": "GrownModel", "family": self.family.name, "config": self.config.to_dict(), "spec": self.spec,
                "step": self.step}
        return meta, tensors

    @classmethod
    def restore(cls, meta: dict, tensors: dict[str, torch.Tensor]) -> "GrownModel":
        fam = FAMILY[meta.get("family", DEFAULT_FAMILY)]  # files written before there were families: gpt2
        cd = {k: v for k, v in meta["config"].items() if k not in ("architectures", "transformers_version")}
        config = fam.config_class(**cd)
        config._attn_implementation = "sdpa"
        prefix = "inner." if any(k.startswith("inner.") for k in tensors) else "gpt2."  # before 0.2: "gpt2."
        sd = {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}
        core = load_into(empty_model(config), sd)
        bufs = {k[7:]: v for k, v in tensors.items() if k.startswith("growlm.")}
        return cls(core, meta["spec"], bufs, int(meta.get("step", 0)))


GrownGPT2 = GrownModel  # the name before the Llama family; plugins may use it
