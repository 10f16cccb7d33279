"""Filling a model built on the meta device with weights (`load_into`), and the buffers such a model
still lacks, which come from its config rather than a state dict (`materialise_buffers`: Llama's rotary
frequencies). Family-neutral: every family's models are filled this way (`growlm.families`), and so are
the grown and learned models of `growlm.growth`.
"""

from __future__ import annotations

import torch


def load_into(model, sd: dict[str, torch.Tensor]):
    """Assign the tensors of `sd` to a (meta) model of any family; tie the head if the config says so."""
    sd = {k: v.detach().clone().contiguous() for k, v in sd.items()}
    tied = bool(getattr(model.config, "tie_word_embeddings", True))
    if tied:
        sd.pop("lm_head.weight", None)
    missing, unexpected = model.load_state_dict(sd, strict=False, assign=True)
    missing = [k for k in missing if not (tied and k == "lm_head.weight")]
    if missing or unexpected:
        raise RuntimeError(f"weights do not fit the config: missing {missing}, unexpected {unexpected}")
    if tied:
        model.lm_head.weight = model.get_input_embeddings().weight
    materialise_buffers(model)
    model.eval()
    return model


def materialise_buffers(model) -> None:
    """Buffers still on the meta device, made real: non-persistent ones (Llama's rotary `inv_freq`)
    are computed from the config, not loaded from a state dict."""
    for name, buf in list(model.named_buffers()):
        if buf.device.type != "meta":
            continue
        owner_name, _, _ = name.rpartition(".")
        owner = model.get_submodule(owner_name) if owner_name else model
        if not hasattr(owner, "rope_type"):
            raise RuntimeError(f"buffer {name} was not materialised")
        fresh = type(owner)(owner.config)  # the rotary embedding: its frequencies from the config
        for buf_name, value in fresh.named_buffers(recurse=False):
            setattr(owner, buf_name, value)
        owner.attention_scaling = fresh.attention_scaling
