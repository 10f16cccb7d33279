"""Growth at real sizes: a member of SmolLM2-135M's shape grown to SmolLM2-360M's.

The member is a random Llama of SmolLM2-135M's shape (d 576, 30 layers, 9 heads, 3 key/value heads, MLP
1536, vocabulary 49152, tied head); it is grown with `growlm.growth.grow` to SmolLM2-360M's shape (d 960,
32 layers: 15 heads, 5 key/value heads, MLP 2560) by lemon+zero_block, msg and net2net+zero_block. Each
growth runs in its own process (so its peak memory is its own; --quick runs the three in one process: at
its sizes the peak is the interpreter's) and reports, against yardsticks measured in the same run:

- the growth's wall-clock and CPU time, as a ratio to one forward+backward of the member (float32, one
  window of --tokens tokens, timed in the same process just before the growth);
- the peak resident memory of that process, as a ratio to the member's bytes (its parameters in the
  growth's dtype);
- the function-preservation error: max |logit difference| between the grown model and the member on
  random tokens, both computed in float64 with float64 norms (`growlm.growth.algebra.float64_norms`), and
  against the member as transformers computes it (float32 norms: that member's own rounding);
- the grown model's parameter count against SmolLM2-360M's 361,821,120, and its heads / key/value heads /
  MLP width.

    nice .venv/bin/python bench/smollm_sizes.py                       # float64, the three methods, 1 thread
    nice .venv/bin/python bench/smollm_sizes.py --dtype float32 --threads 2
    .venv/bin/python bench/smollm_sizes.py --quick                    # a small shape: seconds (smoke test)

The last line is `smollm_sizes lemon+zero_block=<time ratio> msg=<...> net2net+zero_block=<...>`.

Growth through the workflow (a pretrained member folder of this shape, a few refinement steps on the
CPU): bench/config/smollm.yaml, whose header has the commands; results in bench/RESULTS.md, section 12.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

REPO = Path(__file__).resolve().parents[1]
SMOLLM_360M_PARAMS = 361_821_120
METHODS = {"lemon+zero_block": ["lemon", "zero_block"], "msg": "msg", "net2net+zero_block": ["net2net", "zero_block"]}
SHAPES = {  # (d0, L0, head size, key/value heads, MLP, vocab) -> (d1, L1)
    "smollm": dict(d0=576, L0=30, dh=64, r=3, f0=1536, V=49152, d1=960, L1=32),
    "quick": dict(d0=48, L0=3, dh=16, r=3, f0=128, V=500, d1=80, L1=4),
}


def member(shape: dict, dtype: torch.dtype):
    from growlm.model import build_model

    return build_model(seed=0, family="llama", n_embd=shape["d0"], n_layer=shape["L0"], vocab_size=shape["V"],
                       n_positions=2048, head_dim=shape["dh"], heads_per_kv=shape["r"],
                       mlp_ratio=shape["f0"] / shape["d0"], tie_word_embeddings=True).to(dtype).eval()


def forward_backward_seconds(model, tokens: int, reps: int = 2) -> tuple[float, float]:
    """(wall, CPU) seconds of one forward+backward of a float32 copy of `model` on one window."""
    import torch

    m = model.float().train()
    x = torch.randint(0, m.config.vocab_size, (1, tokens), generator=torch.Generator().manual_seed(0))
    out = []
    for _ in range(reps + 1):
        t, c = time.perf_counter(), time.process_time()
        m(input_ids=x, labels=x).loss.backward()
        out.append((time.perf_counter() - t, time.process_time() - c))
        m.zero_grad(set_to_none=True)
    return min(o[0] for o in out[1:]), min(o[1] for o in out[1:])


def make_member(out: Path) -> None:
    """The workflow's member: a random float32 Llama of SmolLM2-135M's shape saved as a save_pretrained
    folder with a byte-level BPE tokenizer fitted on the bundled books (asked for 49152 tokens; the books
    give fewer, so the ids in use are the first ones of the member's 49152)."""
    import torch

    from growlm.model import save_model
    from growlm.tokenizer import fit_tokenizer, vocab_size

    out = Path(out)
    tok = out.parent / "tokenizer"
    books = sorted((REPO / "workflow" / "resources" / "corpus").glob("*.txt"))
    fit_tokenizer(books, tok, vocab_size=SHAPES["smollm"]["V"])
    save_model(member(SHAPES["smollm"], torch.float32), out, tokenizer_dir=tok)
    (out / "growlm.json").unlink(missing_ok=True)
    print(f"{out}: tokenizer of {vocab_size(tok)} tokens, model vocabulary {SHAPES['smollm']['V']}")


def one(args, name: str) -> dict:
    """The growth by method `name` in this process (a child of `main`, which itself does not import torch)."""
    import torch

    from growlm.growth import GrownModel, grow
    from growlm.growth.algebra import float64_norms

    torch.set_num_threads(args.threads)
    shape, dtype = SHAPES[args.shape], getattr(torch, args.dtype)
    ref_wall, ref_cpu = forward_backward_seconds(member(shape, torch.float32), args.tokens)
    src = member(shape, dtype)
    member_bytes = sum(p.numel() * p.element_size() for p in src.parameters())
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    t, c = time.perf_counter(), time.process_time()
    grown = grow([src], METHODS[name], n_embd=shape["d1"], n_layer=shape["L1"], seed=0)
    wall, cpu = time.perf_counter() - t, time.process_time() - c
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    core = grown.inner if isinstance(grown, GrownModel) else grown
    cfg = core.config
    params = sum(p.numel() for p in core.parameters())
    x = torch.randint(0, shape["V"], (1, 64), generator=torch.Generator().manual_seed(1))
    grown, src = grown.double(), src.double()
    float64_norms(core)
    with torch.no_grad():
        plain = float((grown(input_ids=x).logits - src(input_ids=x).logits).abs().max())
        float64_norms(src)
        err = float((grown(input_ids=x).logits - src(input_ids=x).logits).abs().max())
    return {"method": name, "dtype": args.dtype, "threads": args.threads, "wall_s": wall, "cpu_s": cpu,
            "ref_wall_s": ref_wall, "ref_cpu_s": ref_cpu, "peak_rss_bytes": peak, "rss_before_bytes": rss_before,
            "member_bytes": member_bytes, "err_float64": err, "err_vs_transformers_member": plain, "params": params,
            "heads": cfg.num_attention_heads, "kv_heads": cfg.num_key_value_heads,
            "mlp": cfg.intermediate_size, "layers": cfg.num_hidden_layers, "width": cfg.hidden_size}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtype", default="float64", choices=["float64", "float32", "bfloat16"])
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads of each growth (default 1)")
    ap.add_argument("--tokens", type=int, default=256, help="tokens of the forward+backward yardstick")
    ap.add_argument("--method", action="append", choices=sorted(METHODS), help="default: all three")
    ap.add_argument("--quick", action="store_true", help="a small shape (smoke test)")
    ap.add_argument("--make-member", metavar="DIR", help="write the workflow's member folder there and stop")
    ap.add_argument("--one", action="append", help=argparse.SUPPRESS)
    ap.add_argument("--shape", default="smollm", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.make_member:
        make_member(Path(args.make_member))
        return 0
    if args.one:
        for name in args.one:
            print(json.dumps(one(args, name)), flush=True)
        return 0
    shape = "quick" if args.quick else "smollm"
    names = args.method or list(METHODS)
    rows = []
    for group in [names] if args.quick else [[name] for name in names]:  # a process per growth (--quick: one)
        cmd = [sys.executable, __file__, *(w for name in group for w in ("--one", name)), "--shape", shape,
               "--dtype", args.dtype, "--threads", str(args.threads), "--tokens", str(args.tokens)]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
        rows += [json.loads(line) for line in proc.stdout.strip().splitlines()[-len(group):]]
    print(f"shape {shape}, {args.dtype}, {args.threads} thread(s); yardstick: one forward+backward of the member "
          f"(float32, {args.tokens} tokens)")
    print("| method | grow wall s | grow CPU s | wall / fwd+bwd | CPU / fwd+bwd | peak RSS GB | peak RSS / member "
          "bytes | error (float64) | error vs transformers' member | params | vs 361.8M | heads / kv / MLP |")
    print("|" + " --- |" * 12)
    for r in rows:
        print(f"| {r['method']} | {r['wall_s']:.1f} | {r['cpu_s']:.1f} | {r['wall_s'] / r['ref_wall_s']:.1f} | "
              f"{r['cpu_s'] / r['ref_cpu_s']:.1f} | {r['peak_rss_bytes'] / 1e9:.2f} | "
              f"{r['peak_rss_bytes'] / r['member_bytes']:.1f} | {r['err_float64']:.1e} | "
              f"{r['err_vs_transformers_member']:.1e} | {r['params']:,} | {r['params'] / SMOLLM_360M_PARAMS:.4f} | "
              f"{r['heads']} / {r['kv_heads']} / {r['mlp']} |")
    print(json.dumps(rows))
    print("smollm_sizes " + " ".join(f"{r['method']}={r['wall_s'] / r['ref_wall_s']:.2f}" for r in rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
