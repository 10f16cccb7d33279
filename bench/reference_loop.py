"""A minimal nanoGPT-style GPT-2 and training step: the yardstick for growlm's training loop.

The architecture is Hugging Face's GPT-2 as growlm builds it (`growlm.families.GPT2Family.config`): token +
learned position embeddings, pre-LayerNorm blocks (LayerNorm with bias, eps 1e-5), one fused qkv
Linear with bias, `F.scaled_dot_product_attention(is_causal=True)`, exact (erf) GELU, a 4x MLP,
Linear layers with biases, a final LayerNorm and an LM head tied to the token embedding (no bias),
no dropout. `load_hf_weights` copies a `GPT2LMHeadModel`'s weights in, so a test can check that the
two compute the same function.

The training step is the plain one: AdamW (decay on >= 2-D tensors only, fused on CUDA), the same
warm-up + cosine learning rate set each step, `F.cross_entropy`, clipping at 1.0, bf16 autocast on
CUDA, nanoGPT's `get_batch` (random windows of a uint16 token array).
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, d: int, n_head: int, eps: float = 1e-5):
        super().__init__()
        self.n_head = n_head
        self.ln_1 = nn.LayerNorm(d, eps=eps)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln_2 = nn.LayerNorm(d, eps=eps)
        self.fc = nn.Linear(d, 4 * d)
        self.fc_proj = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.fc_proj(F.gelu(self.fc(self.ln_2(x))))


class RefGPT(nn.Module):
    def __init__(self, *, vocab_size: int, n_positions: int, n_embd: int, n_layer: int, n_head: int):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(n_positions, n_embd)
        self.blocks = nn.ModuleList(Block(n_embd, n_head) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)
        self.head = nn.Linear(n_embd, vocab_size, bias=False)
        self.head.weight = self.wte.weight  # tied
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * n_layer) if name.endswith("proj.weight") else 0.02)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.size(1), device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))

    @classmethod
    def like(cls, hf_config) -> "RefGPT":
        """The same architecture as a growlm `GPT2Config`."""
        return cls(vocab_size=hf_config.vocab_size, n_positions=hf_config.n_positions,
                   n_embd=hf_config.n_embd, n_layer=hf_config.n_layer, n_head=hf_config.n_head)

    @torch.no_grad()
    def load_hf_weights(self, hf_model) -> "RefGPT":
        """Copy a GPT2LMHeadModel's weights in (HF's Conv1D stores [in, out]: transpose)."""
        t = hf_model.transformer
        self.wte.weight.copy_(t.wte.weight)
        self.wpe.weight.copy_(t.wpe.weight)
        for mine, theirs in zip(self.blocks, t.h):
            for a, b in ((mine.ln_1, theirs.ln_1), (mine.ln_2, theirs.ln_2)):
                a.weight.copy_(b.weight)
                a.bias.copy_(b.bias)
            for a, b in ((mine.qkv, theirs.attn.c_attn), (mine.proj, theirs.attn.c_proj),
                         (mine.fc, theirs.mlp.c_fc), (mine.fc_proj, theirs.mlp.c_proj)):
                a.weight.copy_(b.weight.t())
                a.bias.copy_(b.bias)
        self.ln_f.weight.copy_(t.ln_f.weight)
        self.ln_f.bias.copy_(t.ln_f.bias)
        return self


class RefTrainer:
    """nanoGPT's loop body: get_batch, lr schedule, forward under autocast, backward, clip, step."""

    def __init__(self, model: RefGPT, tokens: np.ndarray, *, batch_size: int, context: int, device: str = "cpu",
                 lr: float = 1e-3, min_lr_ratio: float = 0.1, warmup_steps: int = 50, total_steps: int = 1000,
                 weight_decay: float = 0.1, betas=(0.9, 0.95), grad_clip: float = 1.0, seed: int = 0):
        self.model = model.to(device).train()
        self.tokens, self.B, self.T, self.device = tokens, batch_size, context, device
        self.lr, self.min_lr, self.warmup, self.total = lr, lr * min_lr_ratio, warmup_steps, total_steps
        self.grad_clip = grad_clip
        params = [p for p in model.parameters() if p.requires_grad]
        groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
                  {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
        cuda = device.startswith("cuda")
        self.optimizer = torch.optim.AdamW(groups, lr=lr, betas=betas, fused=True if cuda else None)
        self.autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=cuda)
        self.gen = torch.Generator().manual_seed(seed)
        self.step_no = 0

    def get_lr(self, it: int) -> float:
        if it < self.warmup:
            return self.lr * (it + 1) / self.warmup
        ratio = min(1.0, (it - self.warmup) / max(1, self.total - self.warmup))
        return self.min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (self.lr - self.min_lr)

    def get_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        ix = torch.randint(len(self.tokens) - self.T - 1, (self.B,), generator=self.gen)
        x = torch.stack([torch.from_numpy(self.tokens[i:i + self.T].astype(np.int64)) for i in ix])
        y = torch.stack([torch.from_numpy(self.tokens[i + 1:i + 1 + self.T].astype(np.int64)) for i in ix])
        if self.device.startswith("cuda"):
            return x.pin_memory().to(self.device, non_blocking=True), y.pin_memory().to(self.device, non_blocking=True)
        return x.to(self.device), y.to(self.device)

    def step(self, *, sync: bool = True) -> float | None:
        """One optimizer step; returns the loss (a host sync) when `sync`."""
        lr = self.get_lr(self.step_no)
        for g in self.optimizer.param_groups:
            g["lr"] = lr
        x, y = self.get_batch()
        with self.autocast:
            logits = self.model(x)
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step_no += 1
        return loss.item() if sync else None
