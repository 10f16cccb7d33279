"""GrownGPT2: a GPT-2 with growth masks and grouped LayerNorm, ramped into a plain GPT-2.

Used by `msg` (Masked Structural Growth) and `concat` (n members side by side). It wraps a plain
`GPT2LMHeadModel` (`.gpt2`, the weights the optimizer trains) and evaluates it with three ramps,
each 0 at step 0 and 1 when done:

* masks (MSG): new residual coordinates, heads, MLP units and blocks have their outputs multiplied
  by c_mask (embeddings and writers on new coordinates, head outputs before c_proj, MLP activations,
  LN outputs on new coordinates, and the residual branches of new blocks:
  x <- x + c * Block(x)); LN statistics are weighted by the residual mask, so at c=0 the old
  coordinates see exactly the source model whatever the new weights are.
* cross (concat, cross="random"): weights connecting different members' units are multiplied by
  c_cross.
* ln (concat): LN mean and variance are computed per member group and mixed into the full-width
  ones: mu_c = (1-c) mu_group + c mu_all, var_c = (1-c) var_group + c var_all,
  eps_c = (1-c) eps_group + c eps (each group may have its own eps after LEMON padding).

Protocol: `growth_step(step)` (the training loop calls it before every step) sets the ramps;
`ramp_done` is True once every ramp is at 1, and then the module computes exactly its inner GPT-2
(it delegates to it); `to_gpt2()` returns that inner GPT2LMHeadModel (sharing the parameters), and
raises GrowlmError before the ramps are done. `config` is the inner model's config (FLOPs etc.).
`export()` / `GrownGPT2.restore()` give a JSON-able description + a flat tensor dict (no pickle),
used by `growlm.growth.save_grown` / `load_grown`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GPT2Config, GPT2LMHeadModel
from transformers.modeling_outputs import CausalLMOutput

from growlm.errors import GrowlmError
from growlm.growth.common import empty_model, load_into, pack, ramp, target_config, unpack, with_blocks

MASK_KEYS = ("res_new", "head_new", "mlp_new", "block_new")
GROUP_KEYS = ("res_group", "head_group", "mlp_group", "group_eps")


class GrownGPT2(nn.Module):
    def __init__(self, gpt2: GPT2LMHeadModel, spec: dict, buffers: dict[str, torch.Tensor], step: int = 0):
        super().__init__()
        self.gpt2 = gpt2
        self.spec = {"ramp_steps": 0, "ln_ramp_steps": 0, "cross_masked": False, "kind": "grown", **spec}
        self.has_masks = all(k in buffers for k in MASK_KEYS)
        self.has_groups = all(k in buffers for k in GROUP_KEYS)
        if not self.has_masks and not self.has_groups:
            raise ValueError("GrownGPT2 needs mask buffers or group buffers")
        for k, v in buffers.items():
            self.register_buffer(k, v.clone())
        if self.has_groups:
            G = int(self.group_eps.numel())
            self.register_buffer("_onehot", F.one_hot(self.res_group, G).to(self.gpt2.dtype), persistent=False)
        self.step = 0
        self.growth_step(step)

    # -- protocol ---------------------------------------------------------------------------------
    @property
    def config(self) -> GPT2Config:
        return self.gpt2.config

    def growth_step(self, step: int) -> None:
        self.step = int(step)
        self.c_mask = ramp(step, self.spec["ramp_steps"]) if self.has_masks else 1.0
        self.c_cross = ramp(step, self.spec["ramp_steps"]) if self.spec["cross_masked"] else 1.0
        self.c_ln = ramp(step, self.spec["ln_ramp_steps"]) if self.has_groups else 1.0

    def set_ramps(self, *, ramp_steps: int | None = None, ln_ramp_steps: int | None = None) -> None:
        """Set the ramp lengths (refinement steps); the refinement does, to fit its own length."""
        if ramp_steps is not None:
            self.spec["ramp_steps"] = int(ramp_steps)
        if ln_ramp_steps is not None:
            self.spec["ln_ramp_steps"] = int(ln_ramp_steps)
        self.growth_step(self.step)

    @property
    def ramp_done(self) -> bool:
        return self.c_mask >= 1.0 and self.c_cross >= 1.0 and self.c_ln >= 1.0

    def to_gpt2(self) -> GPT2LMHeadModel:
        if not self.ramp_done:
            raise GrowlmError(
                f"the {self.spec['kind']} growth ramps are not complete at step {self.step} "
                f"(ramp_steps={self.spec['ramp_steps']}, ln_ramp_steps={self.spec['ln_ramp_steps']}); "
                f"train at least that many steps before converting to a plain GPT-2")
        return self.gpt2

    @property
    def dtype(self) -> torch.dtype:
        return self.gpt2.dtype

    # -- forward ----------------------------------------------------------------------------------
    def forward(self, input_ids: torch.LongTensor, labels: torch.LongTensor | None = None,
                attention_mask: torch.Tensor | None = None, **kwargs):
        if self.ramp_done:
            return self.gpt2(input_ids=input_ids, labels=labels, attention_mask=attention_mask, **kwargs)
        return self.masked_forward(input_ids, labels=labels, attention_mask=attention_mask)

    def masked_forward(self, input_ids: torch.LongTensor, labels: torch.LongTensor | None = None,
                       attention_mask: torch.Tensor | None = None):
        """The forward pass with the current ramps (at all ramps = 1 it equals `self.gpt2`)."""
        if attention_mask is not None and not bool(attention_mask.all()):
            raise GrowlmError("GrownGPT2 supports only full (causal) attention before its ramps are done")
        t = self.gpt2.transformer
        cfg = self.config
        d, H = cfg.n_embd, cfg.n_head
        dh = d // H
        B, T = input_ids.shape
        m_res = m_head = m_mlp = None
        if self.has_masks:
            keep = 1.0 - self.c_mask
            m_res = 1.0 - keep * self.res_new
            m_head = 1.0 - keep * self.head_new
            m_mlp = 1.0 - keep * self.mlp_new
            m_block = 1.0 - keep * self.block_new
        pos = torch.arange(T, device=input_ids.device)
        x = t.wte(input_ids) + t.wpe(pos)[None]
        if m_res is not None:
            x = x * m_res.to(x.dtype)
        cross = self._cross_factors() if self.c_cross < 1.0 else None
        for l, blk in enumerate(t.h):
            mb = m_block[l].to(x.dtype) if self.has_masks else 1.0
            h = self._ln(x, blk.ln_1, m_res)
            w = blk.attn.c_attn.weight
            if cross is not None:
                w = w * cross["qkv"].to(w.dtype)
            qkv = h @ w + blk.attn.c_attn.bias
            q, k, v = (z.reshape(B, T, H, dh).transpose(1, 2) for z in qkv.split(d, dim=-1))
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=blk.attn.scaling)
            if m_head is not None:
                a = a * m_head.to(a.dtype)[None, :, None, None]
            a = a.transpose(1, 2).reshape(B, T, d)
            w = blk.attn.c_proj.weight
            if cross is not None:
                w = w * cross["o"].to(w.dtype)
            o = a @ w + blk.attn.c_proj.bias
            if m_res is not None:
                o = o * m_res.to(o.dtype)
            x = x + mb * o
            h = self._ln(x, blk.ln_2, m_res)
            w = blk.mlp.c_fc.weight
            if cross is not None:
                w = w * cross["fc"].to(w.dtype)
            u = blk.mlp.act(h @ w + blk.mlp.c_fc.bias)
            if m_mlp is not None:
                u = u * m_mlp.to(u.dtype)
            w = blk.mlp.c_proj.weight
            if cross is not None:
                w = w * cross["pr"].to(w.dtype)
            p = u @ w + blk.mlp.c_proj.bias
            if m_res is not None:
                p = p * m_res.to(p.dtype)
            x = x + mb * p
        x = self._ln(x, t.ln_f, m_res)
        logits = self.gpt2.lm_head(x)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(),
                                   labels[:, 1:].reshape(-1), ignore_index=-100)
        return CausalLMOutput(loss=loss, logits=logits)

    def _ln(self, x: torch.Tensor, ln: nn.LayerNorm, m_res: torch.Tensor | None) -> torch.Tensor:
        xf = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
        w = None if m_res is None else m_res.to(xf.dtype)
        eps = float(self.config.layer_norm_epsilon)
        mu = var = None
        if not self.has_groups or self.c_ln > 0:
            if w is None:
                mu = xf.mean(-1, keepdim=True)
                var = (xf - mu).pow(2).mean(-1, keepdim=True)
            else:
                tot = w.sum()
                mu = (xf * w).sum(-1, keepdim=True) / tot
                var = ((xf - mu).pow(2) * w).sum(-1, keepdim=True) / tot
        if self.has_groups and self.c_ln < 1:
            G = self._onehot.to(xf.dtype)
            wG = G if w is None else G * w[:, None]
            cnt = wG.sum(0)
            mu_g = ((xf @ wG) / cnt)[..., self.res_group]
            var_g = (((xf - mu_g).pow(2) @ wG) / cnt)[..., self.res_group]
            eps_g = self.group_eps.to(xf.dtype)[self.res_group]
            c = self.c_ln
            if mu is None:
                mu, var, eps = mu_g, var_g, eps_g
            else:
                mu, var, eps = (1 - c) * mu_g + c * mu, (1 - c) * var_g + c * var, (1 - c) * eps_g + c * eps
        y = (xf - mu) / torch.sqrt(var + eps) * ln.weight.to(xf.dtype) + ln.bias.to(xf.dtype)
        if w is not None:
            y = y * w
        return y.to(x.dtype)

    def _cross_factors(self) -> dict[str, torch.Tensor]:
        """1 on weights within a member, c_cross on weights between members."""
        dh = self.config.n_embd // self.config.n_head
        hc = self.head_group.repeat_interleave(dh)
        keep = 1.0 - self.c_cross

        def f(a, b):
            return 1.0 - keep * (a[:, None] != b[None, :]).to(self.gpt2.dtype)

        return {"qkv": f(self.res_group, hc.repeat(3)), "o": f(hc, self.res_group),
                "fc": f(self.res_group, self.mlp_group), "pr": f(self.mlp_group, self.res_group)}

    # -- structure edits (depth operators after concat) ---------------------------------------------
    def with_blocks(self, blocks: list[dict], block_map: list[int | None]) -> "GrownGPT2":
        c = self.config
        W = with_blocks(unpack(self.gpt2), blocks)
        core = pack(W, target_config(c, n_embd=c.n_embd, n_layer=len(blocks), n_head=c.n_head, n_inner=c.n_inner))
        bufs = {k: getattr(self, k) for k in MASK_KEYS + GROUP_KEYS if hasattr(self, k)}
        if self.has_masks:
            old = self.block_new
            bufs["block_new"] = torch.stack([old[j] if j is not None else torch.zeros_like(old[0])
                                             for j in block_map])
        return GrownGPT2(core, self.spec, bufs, self.step)

    # -- serialisation ----------------------------------------------------------------------------
    def export(self) -> tuple[dict, dict[str, torch.Tensor]]:
        tensors = {}
        tied = bool(self.config.tie_word_embeddings)
        for k, v in self.gpt2.state_dict().items():
            if tied and k == "lm_head.weight":
                continue
            tensors["gpt2." + k] = v.detach().contiguous().cpu()
        for k in MASK_KEYS + GROUP_KEYS:
            if hasattr(self, k):
                tensors["growlm." + k] = getattr(self, k).detach().contiguous().cpu()
        meta = {"class": "GrownGPT2", "config": self.config.to_dict(), "spec": self.spec, "step": self.step}
        return meta, tensors

    @classmethod
    def restore(cls, meta: dict, tensors: dict[str, torch.Tensor]) -> "GrownGPT2":
        cd = {k: v for k, v in meta["config"].items() if k not in ("architectures", "transformers_version")}
        config = GPT2Config(**cd)
        config._attn_implementation = "sdpa"
        sd = {k[5:]: v for k, v in tensors.items() if k.startswith("gpt2.")}
        core = load_into(empty_model(config), sd)
        bufs = {k[7:]: v for k, v in tensors.items() if k.startswith("growlm.")}
        return cls(core, meta["spec"], bufs, int(meta.get("step", 0)))
