"""The benchmarks run (no timing is asserted), the reference model is HF's GPT-2, the fused loss is exact.

`bench/refine_speed.py --quick` and `bench/gpu.py --cpu-smoke` are run, and their output checked, by
tests/test_gpu_check.py's smoke test: `bench/gpu_check --smoke` runs them as its refine and mfu parts."""

import os
import re
import subprocess
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(REPO / "workflow" / "scripts"), "PYTHONUNBUFFERED": "1"}


def _run(*args: str, timeout: int = 120) -> str:
    proc = subprocess.run([sys.executable, *args], cwd=REPO, env=ENV, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def test_throughput_quick_prints_a_positive_ratio():
    out = _run("bench/throughput.py", "--quick")
    last = out.strip().splitlines()[-1]
    m = re.fullmatch(r"throughput_ratio=([0-9.]+)", last)
    assert m, out[-2000:]
    assert float(m.group(1)) > 0


def test_prep_bench_prints_rates_and_flat_memory_fields(tmp_path):
    out = _run("bench/prep.py", "--sizes", "1", "2", "--sample-mb", "1", "--dir", str(tmp_path), timeout=300)
    last = out.strip().splitlines()[-1]
    m = re.fullmatch(r"prep_mb_per_s=([0-9.]+) reference_mb_per_s=([0-9.]+) ratio=([0-9.]+) "
                     r"peak_mb=1:(\d+)/(\d+),2:(\d+)/(\d+) cores=\d+", last)
    assert m, out[-2000:]
    assert all(float(v) > 0 for v in m.groups())


def test_smollm_sizes_quick_grows_exactly_and_prints_ratios():
    out = _run("bench/smollm_sizes.py", "--quick", timeout=300)
    m = re.fullmatch(r"smollm_sizes lemon\+zero_block=([0-9.]+) msg=([0-9.]+) net2net\+zero_block=([0-9.]+)",
                     out.strip().splitlines()[-1])
    assert m, out[-2000:]
    rows = {r.split("|")[1].strip(): r.split("|") for r in out.splitlines() if r.startswith(("| lemon", "| msg"))}
    assert float(rows["lemon+zero_block"][8]) < 1e-10 and float(rows["msg"][8]) < 1e-10  # exact in float64


def test_reference_model_is_hf_gpt2():
    sys.path.insert(0, str(REPO / "bench"))
    try:
        from reference_loop import RefGPT
    finally:
        sys.path.remove(str(REPO / "bench"))
    from growlm.model import build_model

    hf = build_model(seed=0, n_embd=32, n_layer=2, vocab_size=100, n_positions=16, head_dim=8)
    ref = RefGPT.like(hf.config).load_hf_weights(hf)
    x = torch.randint(0, 100, (3, 16))
    assert sum(p.numel() for p in ref.parameters()) == sum(p.numel() for p in hf.parameters())
    torch.testing.assert_close(ref(x), hf(input_ids=x).logits, rtol=0, atol=1e-5)


def test_fused_head_loss_matches_cross_entropy():
    from growlm.loss import lm_loss
    from growlm.model import build_model

    model = build_model(seed=0, n_embd=32, n_layer=1, vocab_size=4096, n_positions=32, head_dim=8)
    x, y = torch.randint(0, 4096, (20, 32)), torch.randint(0, 4096, (20, 32))  # 640 rows: 3 chunks
    loss, logits = lm_loss(model, x, y)
    loss.backward()
    want = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    fused, none = lm_loss(model, x, y, logits=False)
    assert none is None and logits.shape == (20, 32, 4096)
    (fused * 3).backward()
    torch.testing.assert_close(fused, loss)
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, 3 * want[n], rtol=1e-4, atol=1e-6, msg=n)


def test_results_headline_is_machine_readable():
    """bench/RESULTS.md begins with `headline: cost_ratio=<x> method=<registered method> seeds=<k>`."""
    from growlm.methods import METHODS, method_chain, schedules

    first = (REPO / "bench" / "RESULTS.md").read_text().splitlines()[0]
    m = re.fullmatch(r"headline: cost_ratio=([0-9.]+) method=(\S+) seeds=(\d+)", first)
    assert m, first
    assert 0 < float(m.group(1)) < 10 and int(m.group(3)) >= 3
    assert all(name in METHODS or name in schedules() for name in method_chain(m.group(2))), m.group(2)
