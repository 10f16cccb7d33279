"""The section "Budgets in tokens per parameter" of bench/RESULTS.md: every benchmark's M_0, its parameters
(non-embedding and all, from the benchmark's config through `growlm.shape.ModelShape`) and its budgets in
tokens per parameter."""

from __future__ import annotations

from rendering.core import RESULTS_PAGE, _merged, block, count, m0_params, per_param, table, tok


@block("budgets-per-parameter", RESULTS_PAGE, "config/config.yaml", "bench/savings.yaml", "bench/scaling.yaml",
       "config/llama.yaml", "bench/budgets.yaml", "bench/budgets_long.yaml", "scaling_summary.csv")
def budgets_per_parameter(default, bench, scaling_cfg, llama, budgets_cfg, long_cfg, scaling) -> str:
    small = m0_params(_merged(default, bench))
    big = m0_params(default)
    big_llama = m0_params(_merged(default, llama))
    small_budgets = sorted({*bench["budgets"], *budgets_cfg["budgets"], *long_cfg["budgets"], 800000})
    rows = [["the savings benchmark (sections 1, 5, 8, 9, 14): d1 = 64, L1 = 4, vocabulary "
             f"{bench['tokenizer']['vocab_size']}", f"{count(small[0])} / {count(small[1])}",
             "; ".join(f"{tok(b)}: {per_param(b, small)}" for b in small_budgets)],
            [f"the default experiment (section 10): d1 = 128, L1 = 4, vocabulary {default['tokenizer']['vocab_size']}",
             f"{count(big[0])} / {count(big[1])} (Llama {count(big_llama[0])} / {count(big_llama[1])})",
             f"{tok(default['train']['large']['tokens'])}: {per_param(default['train']['large']['tokens'], big)}"]]
    cells = []
    for d1 in sorted(scaling["d1"].unique()):
        p = m0_params(_merged(default, scaling_cfg), d1=int(d1))
        b = int(scaling[scaling["d1"] == d1]["budget"].iloc[0])
        cells.append((f"{d1}: {count(p[0])} / {count(p[1])}", f"{d1}, {tok(b)}: {per_param(b, p)}"))
    rows.append([f"the scaling benchmark (section 7): L1 = 4, vocabulary {scaling_cfg['tokenizer']['vocab_size']}",
                 "d1 = " + "; ".join(c[0] for c in cells), "d1 = " + "; ".join(c[1] for c in cells)])
    return table(["setting of M_0", "parameters: non-embedding / all",
                  "budget in tokens: per non-embedding parameter (per parameter)"], rows)
