"""Section 2 of bench/RESULTS.md, the training loop's speed on a CPU against a hand-written loop
(`bench/throughput.py --out`)."""

from __future__ import annotations

from rendering.core import RESULTS_PAGE, block, count, sentence, table


@block("throughput", RESULTS_PAGE, "throughput_cpu.csv")
def throughput(df) -> str:
    rows = [[int(r["d"]), count(r["params"]), f"{r['growlm_tok_s']:,.0f}", f"{r['ref_tok_s']:,.0f}",
             f"{r['ratio']:.3f} ({r['ratio_min']:.3f}-{r['ratio_max']:.3f})"] for _, r in df.iterrows()]
    r = df.iloc[0]
    return table(["d", "parameters", "growlm tokens/s", "reference tokens/s",
                  f"ratio: median of {int(r['rounds'])} rounds (lowest-highest)"], rows) + "\n\n" + sentence(
        "throughput", low=df["ratio"].min(), r=r)
