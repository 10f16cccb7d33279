"""Dense bf16 peak FLOP/s of known GPUs, the denominator of model FLOPs utilisation (MFU).

Looked up by the name `torch.cuda.get_device_name()` reports; the first pattern that matches
wins, so the specific names come before the general ones ("H100 PCIe" before "H100", "A100"
before "A10"). Figures are the vendors' dense (not 2:4-sparse) tensor-core bf16 peaks; the T4
has no bf16 and gets its fp16 peak. A value given explicitly (a config's `peak_flops`, or the
environment variable GROWLM_PEAK_FLOPS) overrides the table; on a CPU, or an unknown GPU with no
override, the peak is None and MFU is not reported.
"""

from __future__ import annotations

import os
import re

import torch

# (regular expression searched in the device name, dense bf16 peak FLOP/s)
PEAK_BF16_FLOPS: list[tuple[str, float]] = [
    (r"GH200|H200", 989e12),
    (r"H100.*PCIe", 756e12),
    (r"H100.*NVL", 835e12),
    (r"H100", 989e12),  # SXM ("NVIDIA H100 80GB HBM3")
    (r"A100", 312e12),
    (r"\bL4\b", 121e12),
    (r"RTX 4090", 165e12),
    (r"\bA10\b", 125e12),
    (r"\bT4\b", 65e12),  # fp16: the T4 has no bf16
]


def peak_flops_for_name(name: str) -> float | None:
    """The table's dense bf16 peak for a device name, or None if it is not in the table."""
    for pattern, peak in PEAK_BF16_FLOPS:
        if re.search(pattern, name):
            return peak
    return None


def choose_device() -> str:
    """The device a job trains on: the GPU when there is one, else the CPU."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def device_name(device: str | torch.device) -> str:
    device = torch.device(device)
    if device.type == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_name(device)
    return device.type


def peak_flops(device: str | torch.device, override: float | None = None) -> float | None:
    """Dense bf16 peak FLOP/s of `device`: `override`, else $GROWLM_PEAK_FLOPS, else the table.

    None on a CPU (unless overridden) and for a GPU the table does not know.
    """
    if override:
        return float(override)
    env = os.environ.get("GROWLM_PEAK_FLOPS")
    if env:
        return float(env)
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    return peak_flops_for_name(device_name(device))


def mfu(model_flops_per_s: float, peak: float | None) -> float | None:
    """Model FLOPs utilisation: achieved model FLOP/s over the peak (None without a peak)."""
    if not peak or model_flops_per_s <= 0:
        return None
    return model_flops_per_s / peak
