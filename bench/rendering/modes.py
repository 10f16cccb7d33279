"""Section 13 of bench/RESULTS.md, what a compute mode changes (`bench/modes.py`): M_0 trained eager and
compiled, on 1 and 2 threads, against eager on one thread and a repeat of it."""

from __future__ import annotations

from rendering.core import RESULTS_PAGE, block, sentence, table


@block("modes", RESULTS_PAGE, "modes_cpu.csv")
def modes(df) -> str:
    rows = [[int(r["run"]), r["mode"], f"{r['final_val_loss']:.9f}", f"{r['loss_rel_diff']:.1e}",
             f"{r['max_weight_rel_diff']:.1e}"] for _, r in df.iterrows()]
    repeat, others = df.iloc[1], df.iloc[2:]
    return table(["run", "mode", "final validation loss", "relative difference", "largest weight difference"],
                 rows) + "\n\n" + sentence(
        "modes", torch=df["torch"].iloc[0], device=df["device"].iloc[0].upper(),
        same=repeat["max_weight_rel_diff"] == 0 == repeat["loss_rel_diff"], repeat=repeat["max_weight_rel_diff"],
        weights=others["max_weight_rel_diff"].max(), losses=others["loss_rel_diff"].max())
