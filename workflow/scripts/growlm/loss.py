"""The next-token loss: the training objective, and the held-out metrics of a trained model.

`lm_loss` is what every training step minimises (mean next-token cross entropy). On a CPU, for a
plain `GPT2LMHeadModel` in fp32, it computes the LM head and the loss together in row chunks
(`FusedHeadCrossEntropy`) and never materialises the logits; elsewhere it is the model's logits
and `F.cross_entropy`. `evaluate` gives held-out loss (nats/token), perplexity and next-token
accuracy over non-overlapping windows of a token split (the test metrics); `validation_loss` the loss the
training loop records at each evaluation, with its standard error (`mean_and_se`, windows as blocks);
`window_losses` each window's summed loss, to compare two models on the same windows.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from growlm.data import eval_batches, eval_windows
from growlm.errors import GrowlmError
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


def mean_and_se(sums, counts, *, block: int = 1) -> tuple[float, float]:
    """The mean per-token loss of an evaluation and its standard error, from each window's summed token
    losses (`sums`) and token count (`counts`): (sum of sums / sum of counts, its standard error).

    Why windows as blocks. The naive standard error, the per-token spread over the square root of the tokens,
    takes every token as an independent draw. Tokens of one window are not: they come from the same passage
    (one book, one topic, one author's vocabulary) and each is predicted from the ones before it, so their
    losses rise and fall together, and a window's mean loss varies far more than its tokens' spread over
    sqrt(tokens) says (by the design effect 1 + (T - 1) rho for T tokens with intra-window correlation rho).
    Windows, non-overlapping stretches of the split, are the units that vary nearly independently; the
    uncertainty of the mean is then the spread of the per-window means over the square root of the windows.
    With windows of unequal length the mean is a ratio (sum over tokens), and its standard error is the
    ratio estimator's (the linearisation a cluster-robust variance uses): residuals r_i = s_i - mean n_i,
    SE^2 = k / (k - 1) * sum r_i^2 / (sum n_i)^2 over k windows; with equal lengths this is exactly the
    per-window means' sample variance over k. It is what a bootstrap that resamples whole windows (a block
    bootstrap) estimates, without the resampling (tests/test_train.py checks both on correlated synthetic
    data). Windows of one book still co-vary (a book spans many windows), which neither sees: on the tiny
    experiment's level-1 training text (949 windows of 32) its trained M_0's standard error is 0.0065 with
    single windows as blocks, 0.0075 with blocks of 4 consecutive windows and 0.0090 with blocks of 16, so
    read it as a lower bound, or give `block`: consecutive windows taken together as one block of that many
    (the last may be shorter), which trades that correlation for fewer blocks. Two models evaluated on the
    same windows are best compared through the windows' paired differences: `mean_and_se(sums_a - sums_b,
    counts)`.

    One block has no spread: its standard error is NaN. Raises GrowlmError for no windows, counts that are
    not positive, sums and counts of different lengths, or a block below 1."""
    s, n = np.asarray(sums, dtype=np.float64).ravel(), np.asarray(counts, dtype=np.float64).ravel()
    if s.shape != n.shape or not s.size:
        raise GrowlmError(f"mean_and_se needs one count per window sum and at least one window; got {s.size} sums "
                          f"and {n.size} counts")
    if not (n > 0).all():
        raise GrowlmError("mean_and_se: every window's token count must be positive")
    if block < 1:
        raise GrowlmError(f"mean_and_se: block must be a number of windows, 1 or more; got {block}")
    if block > 1:  # consecutive windows summed into blocks (np.add.reduceat: each block's sum from its first)
        starts = np.arange(0, s.size, block)
        s, n = np.add.reduceat(s, starts), np.add.reduceat(n, starts)
    total = n.sum()
    mean = float(s.sum() / total)
    k = s.size
    if k < 2:
        return mean, math.nan
    residual = s - mean * n
    return mean, float(math.sqrt(k / (k - 1) * float(np.dot(residual, residual))) / total)


@torch.no_grad()
def _scan(model: torch.nn.Module, batches, device: str) -> tuple[float, int, int, list[np.ndarray]]:
    """Read `batches`: the summed token loss (batch by batch, as `evaluate` always summed it), the correct
    next-token guesses, the tokens, and each window's summed loss (float64). `cross_entropy` is log_softmax
    then nll_loss in torch (no label smoothing, no weights), so the batch sums are cross_entropy's to the bit
    and the per-window sums come from the same log-probabilities at no second softmax."""
    total_loss, total_correct, total, windows = 0.0, 0, 0, []
    for x, y in batches:
        x, y = x.to(device), y.to(device)
        logits = model(input_ids=x).logits.float()
        logp = F.log_softmax(logits.reshape(-1, logits.size(-1)), dim=-1)
        flat = y.reshape(-1)
        total_loss += F.nll_loss(logp, flat, reduction="sum").item()
        token_loss = -logp.gather(1, flat[:, None]).reshape(y.shape)
        windows.append(token_loss.double().sum(1).cpu().numpy())
        total_correct += (logits.argmax(-1) == y).sum().item()
        total += y.numel()
    return total_loss, total_correct, total, windows


@torch.no_grad()
def evaluate(model: torch.nn.Module, tokens: np.ndarray, *, context: int, batch_size: int = 16,
             max_tokens: int | None = None, device: str = "cpu") -> dict:
    """Held-out loss (nats/token), perplexity and next-token accuracy over non-overlapping windows."""
    was_training = model.training
    model.eval()
    total_loss, total_correct, total, _ = _scan(model, eval_batches(tokens, batch_size=batch_size, context=context,
                                                                    max_tokens=max_tokens), device)
    model.train(was_training)
    loss = total_loss / total
    return {"loss": loss, "perplexity": math.exp(min(loss, 50.0)), "accuracy": total_correct / total,
            "tokens": total}


@torch.no_grad()
def window_losses(model: torch.nn.Module, tokens: np.ndarray, *, context: int, batch_size: int = 16,
                  max_tokens: int | None = None, device: str = "cpu") -> np.ndarray:
    """Each window's summed token loss (float64), over the windows `validation_loss` reads for `max_tokens` (None:
    every whole window of the split, as a run's last evaluation reads it). Two models read on the same windows are
    compared through these: `mean_and_se(window_losses(a, ...) - window_losses(b, ...), counts)` is the difference
    of their losses with its standard error, in which what the windows share (a passage every model finds hard)
    cancels, where each loss's own standard error keeps it."""
    was_training = model.training
    model.eval()
    n_win = eval_windows(tokens, context=context, max_tokens=max_tokens)
    windows = _scan(model, eval_batches(tokens, batch_size=batch_size, context=context, max_tokens=n_win * context),
                    device)[3]
    model.train(was_training)
    return np.concatenate(windows)


@torch.no_grad()
def validation_loss(model: torch.nn.Module, tokens: np.ndarray, *, context: int, batch_size: int,
                    max_tokens: int | None, curve_tokens: int | None = None, device: str = "cpu") -> dict:
    """An evaluation of the training loop: the mean loss over the windows of up to `max_tokens` tokens (None:
    the whole split, `growlm.data.eval_windows`), its standard error (`mean_and_se`, the windows as blocks),
    the tokens and windows read, and `curve_loss`, the loss over the first `curve_tokens`' windows (None: the
    same windows), and `window_losses`, each window's mean token loss (float64, to compare two models on the same
    windows: `growlm.runs.paired_windows`). Those first windows are read as batches of their own, exactly as an evaluation of
    `curve_tokens` reads them, so `curve_loss` is that evaluation's loss to the bit: a run's precise last
    evaluation also gives the point its curve's other evaluations would have given. Both are summed batch by
    batch as `evaluate` sums them: without that split (`curve_tokens` None or as many windows) `loss` is
    `evaluate`'s loss to the bit."""
    was_training = model.training
    model.eval()
    n_win = eval_windows(tokens, context=context, max_tokens=max_tokens)
    first = n_win if curve_tokens is None else min(n_win, eval_windows(tokens, context=context, max_tokens=curve_tokens))
    head = _scan(model, eval_batches(tokens, batch_size=batch_size, context=context, max_tokens=first * context),
                 device)
    rest = _scan(model, eval_batches(tokens, batch_size=batch_size, context=context, max_tokens=n_win * context,
                                     start=first), device) if first < n_win else (0.0, 0, 0, [])
    model.train(was_training)
    sums = np.concatenate(head[3] + rest[3])
    _, se = mean_and_se(sums, np.full(sums.size, context))
    total = head[2] + rest[2]
    return {"loss": (head[0] + rest[0]) / total, "se": se, "tokens": total, "windows": int(sums.size),
            "curve_loss": head[0] / head[2], "window_losses": sums / context}
