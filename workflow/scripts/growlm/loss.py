"""The next-token loss: the training objective, and the held-out metrics of a trained model.

`lm_loss` is what every training step minimises (mean next-token cross entropy). On a CPU, for a
plain `GPT2LMHeadModel` in fp32, it computes the LM head and the loss together in row chunks
(`FusedHeadCrossEntropy`) and never materialises the logits; elsewhere it is the model's logits
and `F.cross_entropy`. `evaluate` gives held-out loss (nats/token), perplexity and next-token
accuracy over non-overlapping windows of a token split.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from growlm.data import eval_batches
from growlm.families import FAMILY


class FusedHeadCrossEntropy(torch.autograd.Function):
    """Mean cross entropy of `h @ w.T` against `y`, in row chunks, never holding all the logits.

    The forward pass computes each chunk's logits, its loss and, at once, its gradients (softmax
    minus one-hot) with respect to `h` and `w`; the backward pass only scales them. One exp per
    logit instead of log_softmax's two passes plus its backward, no N x V logits, log-probabilities
    or zero-filled gradient: on a CPU this halves the cost of the head and loss. Deterministic (a
    fixed chunk order), so resumed runs stay bitwise identical.
    """

    @staticmethod
    def forward(ctx, h, w, y, chunk: int):
        n = h.shape[0]
        want_h, want_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_h = torch.empty_like(h) if want_h else None
        grad_w = torch.zeros_like(w) if want_w else None
        total = h.new_zeros((), dtype=torch.float32)
        for i in range(0, n, chunk):
            hc, yc = h[i:i + chunk], y[i:i + chunk, None]
            logits = hc @ w.t()
            target = logits.gather(1, yc)
            top = logits.amax(1, keepdim=True)
            logits.sub_(top).exp_()
            sums = logits.sum(1, keepdim=True)
            total += (sums.log() + top - target).sum()
            if want_h or want_w:
                logits.mul_(1.0 / (n * sums))  # softmax / n
                logits.scatter_add_(1, yc, logits.new_full(yc.shape, -1.0 / n))
                if want_h:
                    torch.mm(logits, w, out=grad_h[i:i + chunk])
                if want_w:
                    grad_w.addmm_(logits.t(), hc)
        ctx.save_for_backward(grad_h, grad_w)
        return total / n

    @staticmethod
    def backward(ctx, grad_out):
        grad_h, grad_w = ctx.saved_tensors
        return (None if grad_h is None else grad_h * grad_out, None if grad_w is None else grad_w * grad_out,
                None, None)


def _cpu_fp32(x: torch.Tensor) -> bool:
    return x.device.type == "cpu" and not torch.is_autocast_enabled("cpu")


def fused_loss_applies(model: torch.nn.Module, x: torch.Tensor) -> bool:
    """A plain model of a family growlm grows (`growlm.families.FAMILY`: GPT2LMHeadModel, LlamaForCausalLM;
    not DDP/FSDP/compiled/grown) in fp32 on the CPU, no autocast. (A grown model during its ramps offers
    the same through `fused_loss_inputs`.)"""
    return (any(type(model) is family.model_class for family in FAMILY.values()) and _cpu_fp32(x)
            and model.lm_head.bias is None and model.lm_head.weight.dtype == torch.float32)


def lm_loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, *,
            logits: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Mean next-token cross entropy and the logits.

    With `logits=False` (the training loop) the logits are not returned (None), which lets a plain
    model on the CPU compute the head and the loss together (`FusedHeadCrossEntropy`).
    """
    parts = None
    if not logits and fused_loss_applies(model, x):
        parts = model.base_model(input_ids=x).last_hidden_state, model.lm_head.weight  # the decoder without its head
    elif not logits and getattr(type(model), "fused_loss_inputs", None) and _cpu_fp32(x):
        parts = model.fused_loss_inputs(x)  # a grown model during its ramps (growlm.growth.masked)
    if parts is not None:
        h, w = parts
        h = h.reshape(-1, h.size(-1))
        chunk = max(64, (1 << 20) // w.shape[0])  # ~4 MB of logits per chunk
        return FusedHeadCrossEntropy.apply(h, w, y.reshape(-1), chunk), None
    out = model(input_ids=x).logits
    # under CUDA autocast cross_entropy runs in fp32 anyway; on the CPU the logits are fp32 already
    loss = F.cross_entropy(out.reshape(-1, out.size(-1)), y.reshape(-1))
    return loss, out


def distill_loss(logits: torch.Tensor, y: torch.Tensor, teacher_logits: torch.Tensor, *, weight: float,
                 temperature: float) -> torch.Tensor:
    """(1 - w) CE(logits, y) + w T^2 KL(softmax(teacher / T) || softmax(logits / T)), mean per token.

    The refinement's loss while the members teach (the `teach` refinement operator): `teacher_logits`
    are the members' logit average (their ensemble), T the temperature, w the current weight. The
    T^2 keeps the KL term's gradient on the scale of the cross entropy's (Hinton et al., 2015):
    d/dz [T^2 KL] = T (softmax(z / T) - softmax(t / T)) per token. Computed in fp32."""
    z = logits.float().reshape(-1, logits.size(-1))
    ce = F.cross_entropy(z, y.reshape(-1))
    if weight <= 0:
        return ce
    t = teacher_logits.float().reshape(-1, z.size(-1))
    log_p = F.log_softmax(z / temperature, dim=-1)
    log_q = F.log_softmax(t / temperature, dim=-1)
    kl = F.kl_div(log_p, log_q, log_target=True, reduction="batchmean")
    return (1.0 - weight) * ce + weight * temperature ** 2 * kl


@torch.no_grad()
def evaluate(model: torch.nn.Module, tokens: np.ndarray, *, context: int, batch_size: int = 16,
             max_tokens: int | None = None, device: str = "cpu") -> dict:
    """Held-out loss (nats/token), perplexity and next-token accuracy over non-overlapping windows."""
    was_training = model.training
    model.eval()
    total_loss, total_correct, total = 0.0, 0, 0
    for x, y in eval_batches(tokens, batch_size=batch_size, context=context, max_tokens=max_tokens):
        x, y = x.to(device), y.to(device)
        logits = model(input_ids=x).logits.float()
        total_loss += F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1),
                                      reduction="sum").item()
        total_correct += (logits.argmax(-1) == y).sum().item()
        total += y.numel()
    model.train(was_training)
    loss = total_loss / total
    return {"loss": loss, "perplexity": math.exp(min(loss, 50.0)), "accuracy": total_correct / total,
            "tokens": total}
