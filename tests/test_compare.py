"""The comparison of M_0 and M_1 (growlm.compare): the FLOPs to reach M_0's loss, the cost ratios,
and the per-arm learning-rate choice of a sweep."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from transformers import GPT2Config, GPT2LMHeadModel

from growlm.compare import choose_learning_rates, first_reach, write_comparison
from growlm.train_config import TrainConfig

PATHS = {
    "small": "{root}/small/m{member}",
    "baseline": "{root}/baseline/t{budget}_lr{lr}/s{seed}",
    "grown": "{root}/grown/{method}/s{seed}",
    "refined": "{root}/refined/{method}/t{budget}_lr{lr}/s{seed}",
    "ensemble": None,
}


def ledger(path, losses, flops_per_eval=100.0):
    path.mkdir(parents=True, exist_ok=True)
    rows = [{"step": i, "tokens": i, "flops": i * flops_per_eval, "wall_s": i * 0.1, "lr": 0, "train_loss": "",
             "val_loss": loss, "peak_mem_mb": 1.0, "kind": "eval"} for i, loss in enumerate(losses)]
    pd.DataFrame(rows).to_csv(path / "ledger.csv", index=False)
    # test-set metrics (the comparison reads them from the model's eval folder; here the same folder)
    (path / "metrics.json").write_text(json.dumps({"levels": {"1": {"loss": losses[-1], "perplexity": 1.0,
                                                                    "accuracy": 0.5}}}))


M0_CONFIG = GPT2Config(n_embd=16, n_layer=2, n_head=2, vocab_size=8, n_positions=4)  # M_0's (tokens per parameter)


def make_experiment(root, curves_m0: dict, curves_m1: dict, seeds=(0, 1), small_flops=50.0):
    """Ledgers for M_0 and M_1 (method 'g') at each learning rate; curves are per lr (same for all seeds
    except a +0.01*seed shift)."""
    paths = {k: (v.replace("{root}", str(root)) if v else v) for k, v in PATHS.items()}
    combos = []
    for seed in seeds:
        grown = root / "grown" / "g" / f"s{seed}"
        grown.mkdir(parents=True, exist_ok=True)
        (grown / "growth.json").write_text(json.dumps(
            {"members": [{"dir": str(root / "small/m1"), "flops": small_flops, "wall_s": 1.0}], "growth_flops": 0}))
        ledger(root / "small" / "m1", [9.0, 8.0])
        for lr, losses in curves_m0.items():
            ledger(root / "baseline" / f"t1000_lr{lr}" / f"s{seed}", [v + 0.01 * seed for v in losses])
            M0_CONFIG.to_json_file(root / "baseline" / f"t1000_lr{lr}" / f"s{seed}" / "config.json")
        for lr, losses in curves_m1.items():
            ledger(root / "refined" / "g" / f"t1000_lr{lr}" / f"s{seed}", [v + 0.01 * seed for v in losses])
            combos.append({"d0": 8, "L0": 1, "d1": 16, "L1": 2, "n": 1, "method": "g", "seed": seed,
                           "budget": 1000, "lr": lr})
    return combos, paths


def test_each_arm_is_compared_at_its_own_best_learning_rate(tmp_path, monkeypatch):
    m0 = {"0.001": [8, 6, 5.0, 4.6], "0.002": [8, 6, 4.5, 4.0], "0.004": [8, 7, 6, 5.5]}
    m1 = {"0.001": [6, 5, 4.2, 3.9], "0.002": [6, 5.5, 5, 4.8], "0.004": [6, 6, 6, 6]}
    combos, paths = make_experiment(tmp_path, m0, m1)
    m0_best, m1_best, table = choose_learning_rates(combos, paths)
    assert m0_best == {("16", "2", "1000"): "0.002"}  # M_0's best is not M_1's best
    assert m1_best == {("g", "8", "1", "16", "2", "1", "1000"): "0.001"}
    assert table["chosen"].sum() == 2 and len(table) == 6
    assert table.loc[(table["arm"] == "M_0") & (table["lr"] == "0.002"), "mean_final_val_loss"].item() == \
        pytest.approx(4.005)

    monkeypatch.setattr("growlm.compare.unigram_loss", lambda *a, **k: 7.0)
    monkeypatch.setattr("growlm.compare.load_tokens", lambda p: np.zeros(4, dtype=np.uint16))
    out = write_comparison(combos, paths, comparison_csv=tmp_path / "c.csv", curves_csv=tmp_path / "k.csv",
                           unigram_train="x", unigram_test="y", vocab_size=8, lr_sweep_csv=tmp_path / "s.csv")
    assert len(out) == 2  # one row per seed, at the chosen rates only
    row = out[out["seed"] == 0].iloc[0]
    assert (row["m0_lr"], row["m1_lr"]) == ("0.002", "0.001")
    # M_0 (lr 0.002) ends at 4.0; M_1 (lr 0.001) reaches 4.0 between its evaluations at 200 and 300 FLOPs:
    # 4.2 -> 3.9, two thirds of the way: 266.7 FLOPs, plus the member's 50
    assert row["m1_flops_to_m0_loss"] == pytest.approx(200 + 100 * (0.2 / 0.3))
    assert row["cost_ratio"] == pytest.approx((50 + 266.6667) / 300, rel=1e-4)
    assert row["cost_ratio_small_free"] == pytest.approx(266.6667 / 300, rel=1e-4)
    # M_0's budget per parameter of M_0, without (and with) the token and position embeddings
    m0 = GPT2LMHeadModel(M0_CONFIG)
    total = sum(p.numel() for p in m0.parameters())
    embeddings = m0.transformer.wte.weight.numel() + m0.transformer.wpe.weight.numel()
    assert (row["tokens_per_param"], row["tokens_per_param_total"]) == (1000 / (total - embeddings), 1000 / total)
    assert pd.read_csv(tmp_path / "s.csv")["chosen"].sum() == 2


def test_a_diverged_rate_never_wins(tmp_path):
    m0 = {"0.001": [8, 6, 5.0], "0.01": [8, 2.0, float("nan")]}
    combos, paths = make_experiment(tmp_path, m0, {"0.001": [6, 5, 4.0], "0.01": [6, 5, 4.5]}, seeds=(0,))
    m0_best, _, _ = choose_learning_rates(combos, paths)
    assert m0_best == {("16", "2", "1000"): "0.001"}


def test_first_reach_interpolates_and_says_never():
    led = pd.DataFrame({"step": [0, 1, 2], "flops": [0.0, 10.0, 20.0], "val_loss": [5.0, 4.0, 3.0]})
    assert first_reach(led, 3.5) == pytest.approx(15.0)
    assert math.isnan(first_reach(led, 2.0))


def test_single_source_chains_cost_one_member(tmp_path):
    """hyperclone (single source) grows m_1 alone: with n = 2 only m_1's training is its cost."""
    from growlm.methods import members_used

    assert members_used(["hyperclone", "zero_block"], 2) == 1
    assert members_used(["concat", "zero_block"], 3) == 3
    assert members_used("ligo", 2) == 2 and members_used(["vcycle"], 0) == 0
    combos, paths = make_experiment(tmp_path, {"0.001": [8, 6, 5.0]}, {"0.001": [6, 5, 4.0]}, seeds=(0,))
    growth = tmp_path / "grown" / "g" / "s0" / "growth.json"
    ledger(tmp_path / "small" / "m2", [9.0, 8.5])
    two = [{"dir": str(tmp_path / "small" / f"m{i}"), "flops": f, "wall_s": 1.0} for i, f in ((1, 50.0), (2, 70.0))]
    from growlm.compare import compare_one

    for chain, cost, arm in ((["hyperclone", "zero_block"], 50.0, "single-source"),
                             (["concat", "zero_block"], 120.0, "n members")):
        growth.write_text(json.dumps({"members": two, "growth_flops": 0, "chain": chain}))
        row, _ = compare_one({**combos[0], "n": 2}, paths)
        assert row["small_flops"] == cost and arm in row["arm"]


def test_report_table_lists_the_learning_rate_sweep(tmp_path, monkeypatch):
    from growlm.report import comparison_html

    m0 = {"0.001": [8, 6, 5.0], "0.002": [8, 6, 4.5]}
    combos, paths = make_experiment(tmp_path, m0, {"0.001": [6, 5, 4.0], "0.002": [6, 5, 4.4]}, seeds=(0,))
    monkeypatch.setattr("growlm.compare.unigram_loss", lambda *a, **k: 7.0)
    monkeypatch.setattr("growlm.compare.load_tokens", lambda p: np.zeros(4, dtype=np.uint16))
    write_comparison(combos, paths, comparison_csv=tmp_path / "c.csv", curves_csv=tmp_path / "k.csv",
                     unigram_train="x", unigram_test="y", vocab_size=8, lr_sweep_csv=tmp_path / "s.csv")
    comparison_html(tmp_path / "c.csv", tmp_path / "t.html", tmp_path / "s.csv")
    html = (tmp_path / "t.html").read_text()
    assert "Learning-rate sweep" in html and 'id="lr_sweep"' in html
    assert "M_0 peak lr" in html and "members used" in html


def test_only_multi_member_chains_get_a_single_member_control():
    """The m_1-only control repeats a single-source chain exactly, so the workflow adds it only where
    an operator combines members."""
    from growlm.methods import needs_single_member_control

    assert needs_single_member_control(["concat", "zero_block"])
    assert needs_single_member_control("ligo")
    assert needs_single_member_control("hyperclone+stack_members")
    assert not needs_single_member_control(["hyperclone", "zero_block"])
    assert not needs_single_member_control("msg")
    assert not needs_single_member_control("apollo")
    assert not needs_single_member_control("vcycle")


def test_the_loss_figure_keeps_its_legend_off_the_curves(tmp_path, monkeypatch):
    """At report size the legend stands beside each panel, not over the curves."""
    from growlm.report import loss_vs_flops_figure

    m0 = {"0.001": [8, 6, 5.0]}
    combos, paths = make_experiment(tmp_path, m0, {"0.001": [6, 5, 4.0]}, seeds=(0, 1))
    monkeypatch.setattr("growlm.compare.unigram_loss", lambda *a, **k: 7.0)
    monkeypatch.setattr("growlm.compare.load_tokens", lambda p: np.zeros(4, dtype=np.uint16))
    write_comparison(combos, paths, comparison_csv=tmp_path / "c.csv", curves_csv=tmp_path / "k.csv",
                     unigram_train="x", unigram_test="y", vocab_size=8)
    fig = loss_vs_flops_figure(tmp_path / "k.csv", tmp_path / "c.csv")
    fig.canvas.draw()
    panels = [ax for ax in fig.axes if ax.get_visible()]
    assert panels
    for ax in panels:
        legend = ax.get_legend()
        assert legend is not None and not legend.get_window_extent().overlaps(ax.get_window_extent())


def test_the_first_page_says_whether_growing_paid_for_each_arm(tmp_path):
    from growlm.report import summary_sentences

    base = {"d0": 64, "L0": 4, "d1": 128, "L1": 4, "n": 2, "budget": 1200000, "m0_final_val_loss": 4.54,
            "ensemble_test_loss": 5.2}
    rows = [
        {**base, "method": "msg", "arm": "grown from m_1 (single-source operator)", "members_used": 1, "seed": 0,
         "reached": True, "cost_ratio": 0.8163, "cost_ratio_small_free": 0.6348, "m1_final_val_loss": 4.446},
        {**base, "method": "concat", "arm": "grown from n members", "members_used": 2, "seed": 0, "reached": True,
         "cost_ratio": 1.213, "cost_ratio_small_free": 0.850, "m1_final_val_loss": 4.521},
        {**base, "method": "concat@m1", "arm": "control: m_1 only", "members_used": 1, "seed": 0, "reached": False,
         "cost_ratio": math.nan, "cost_ratio_small_free": math.nan, "m1_final_val_loss": 4.563},
        {**base, "method": "stack", "arm": "grown from m_1 (single-source operator)", "members_used": 1, "seed": 0,
         "reached": True, "cost_ratio": 1.4, "cost_ratio_small_free": 1.1, "m1_final_val_loss": 4.53},
    ]
    pd.DataFrame(rows).to_csv(tmp_path / "c.csv", index=False)
    text = "\n".join(summary_sentences(tmp_path / "c.csv"))
    assert "M_0 (width 128, 4 layers) trained from scratch for 1,200,000 tokens ends at validation loss 4.540" in text
    assert ("**msg** (grown from m_1 alone): growing paid. M_1 reached M_0's final validation loss at 0.82 of M_0's "
            "FLOPs counting the small model's training (0.63 with it free) and ended at 4.446 (M_0: 4.540).") in text
    assert "**concat** (grown from 2 members): growing paid only if the small models cost nothing. " \
           "M_1 reached M_0's final validation loss at 1.21 of M_0's FLOPs counting the small models' training (0.85 " \
           "with them free)" in text
    assert "**concat@m1** (control: m_1 alone, fed n times): M_1 did not reach M_0's final validation loss" in text
    assert "**stack** (grown from m_1 alone): growing did not pay." in text
    assert "untrained logit-average ensemble has test loss 5.200" in text
    assert "[" not in text  # no Python reprs


def budget_comparison(path):
    """A comparison of three budgets: msg's cost ratio falls as the budget grows, concat's rises, and
    concat's control reaches M_0's loss at the largest budget only (two seeds each)."""
    rows = []
    for budget, msg, concat in ((500_000, 0.95, 0.90), (1_000_000, 0.85, 1.00), (2_000_000, 0.70, 1.15)):
        for seed in (0, 1):
            base = {"d0": 64, "L0": 4, "d1": 128, "L1": 4, "n": 2, "budget": budget, "seed": seed,
                    "m0_final_val_loss": 4.5, "m1_final_val_loss": 4.4, "members_used": 1}
            rows.append({**base, "method": "msg", "arm": "grown from m_1 (single-source operator)", "reached": True,
                         "cost_ratio": msg + 0.02 * seed, "cost_ratio_small_free": msg - 0.2})
            rows.append({**base, "method": "concat", "arm": "grown from n members", "members_used": 2,
                         "reached": True, "cost_ratio": concat + 0.02 * seed, "cost_ratio_small_free": concat - 0.3})
            late = budget == 2_000_000
            rows.append({**base, "method": "concat@m1", "arm": "control: m_1 only", "reached": late,
                         "cost_ratio": 1.3 if late else math.nan, "cost_ratio_small_free": 1.1 if late else math.nan})
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


def test_the_first_page_says_whether_the_saving_grows_with_the_budget(tmp_path):
    from growlm.report import summary_sentences

    text = "\n".join(summary_sentences(budget_comparison(tmp_path / "c.csv")))
    assert "The saving across budgets (width 64 -> 128, n = 2; M_0 and each refinement trained 500,000, 1,000,000, " \
           "2,000,000 tokens)" in text
    assert "**msg**: the saving grows with the budget (0.96, 0.86, 0.71; free: 0.75, 0.65, 0.50)." in text
    assert "**concat**: the saving shrinks with the budget (0.91, 1.01, 1.16; free: 0.60, 0.70, 0.85)." in text
    assert "**concat@m1**: M_1 reached M_0's loss at fewer than two budgets, so no trend (not reached, not " \
           "reached, 1.30;" in text


def test_one_budget_has_no_budget_sentence(tmp_path):
    from growlm.report import summary_sentences

    df = pd.read_csv(budget_comparison(tmp_path / "c.csv"))
    df[df["budget"] == 500_000].to_csv(tmp_path / "one.csv", index=False)
    assert not any("across budgets" in s for s in summary_sentences(tmp_path / "one.csv"))


def test_the_budget_figure_draws_each_arm_against_the_budget(tmp_path):
    """One line per method in each panel (small models counted, free), one point per budget, at the
    mean over the seeds; the control's budgets that no seed reached are marked, not drawn."""
    import matplotlib.pyplot as plt

    from growlm import report

    saved = {}
    real_savefig = plt.Figure.savefig

    def keep(fig, *args, **kwargs):
        saved["fig"] = fig
        return real_savefig(fig, *args, **kwargs)

    comparison = pd.read_csv(budget_comparison(tmp_path / "c.csv"))
    plt.Figure.savefig = keep
    try:
        report.budget_plot(comparison, tmp_path / "b.svg")
    finally:
        plt.Figure.savefig = real_savefig
    assert (tmp_path / "b.svg").stat().st_size > 10_000
    counted, free = saved["fig"].axes[:2]
    for ax, column in ((counted, "cost_ratio"), (free, "cost_ratio_small_free")):
        lines = {c.get_label(): c.lines[0] for c in ax.containers}  # an error-bar line per method
        assert set(lines) == {"msg", "concat", "concat@m1"}
        msg = comparison[comparison["method"] == "msg"].groupby("budget")[column].mean()
        assert list(lines["msg"].get_xdata()) == list(msg.index)
        assert np.allclose(lines["msg"].get_ydata(), msg.values)
        assert [float(v) for v in lines["concat@m1"].get_ydata() if v == v] == [comparison[
            (comparison["method"] == "concat@m1") & (comparison["budget"] == 2_000_000)][column].mean()]
        marks = [t.get_text() for t in ax.texts]
        assert "concat@m1: 0/2 reached" in marks and len([m for m in marks if m.startswith("concat@m1")]) == 2


def test_the_comparison_gives_each_arms_mode_and_the_first_page_says_when_they_differ(tmp_path, monkeypatch):
    """Each arm's mode (growlm.modes) from its models' ledgers: one when all share it, said once on the first
    page; an arm whose refinement resumed under compile names its parts, and the first page says in bold that
    the arms differ by their mode too. A ledger of an older growlm has no mode: 'not recorded'."""
    from growlm.report import comparison_html, summary_sentences

    combos, paths = make_experiment(tmp_path, {"0.001": [8, 6, 5.0]}, {"0.001": [6, 5, 4.0]}, seeds=(0,))
    monkeypatch.setattr("growlm.compare.unigram_loss", lambda *a, **k: 7.0)
    monkeypatch.setattr("growlm.compare.load_tokens", lambda p: np.zeros(4, dtype=np.uint16))
    eager, compiled = "eager, 1 CPU thread", "compiled, 1 CPU thread"
    folders = {"member": tmp_path / "small/m1", "M_0": tmp_path / "baseline/t1000_lr0.001/s0",
               "M_1": tmp_path / "refined/g/t1000_lr0.001/s0"}

    def stamp(folder, *modes):  # the ledger's rows computed in these modes, one after the other
        df = pd.read_csv(folder / "ledger.csv")
        df["mode"] = [modes[min(i * len(modes) // len(df), len(modes) - 1)] for i in range(len(df))]
        df.to_csv(folder / "ledger.csv", index=False)

    def compare():
        table = write_comparison(combos, paths, comparison_csv=tmp_path / "c.csv", curves_csv=tmp_path / "k.csv",
                                 unigram_train="x", unigram_test="y", vocab_size=8)
        return table.iloc[0], "\n".join(summary_sentences(tmp_path / "c.csv"))

    for folder in folders.values():
        stamp(folder, eager)
    row, text = compare()
    assert (row["m0_mode"], row["m1_mode"]) == (eager, eager)
    assert "The models were all computed in one mode: eager, 1 CPU thread." in text and "not all" not in text

    stamp(folders["M_1"], eager, compiled)  # the refinement resumed under train.compile
    row, text = compare()
    assert row["m0_mode"] == eager
    assert row["m1_mode"] == f"members: {eager}; refinement: {eager} then {compiled}"
    assert ("**The models were not all computed in one mode**, so the arms differ in the last digits of their losses "
            "by their mode as well as by their method") in text
    assert f"M_0: {eager}; M_1 (``g``): members: {eager}; refinement: {eager} then {compiled}." in text
    comparison_html(tmp_path / "c.csv", tmp_path / "t.html")
    page = (tmp_path / "t.html").read_text()
    assert "<th>M_0 computed</th>" in page and "<th>M_1 computed</th>" in page and f"{eager} then {compiled}" in page

    pd.read_csv(folders["M_0"] / "ledger.csv").drop(columns="mode").to_csv(folders["M_0"] / "ledger.csv", index=False)
    row, text = compare()
    assert row["m0_mode"] == "not recorded" and "M_0: not recorded" in text


def test_the_first_page_figure_draws_each_arm_from_its_members_cost_to_m0s_loss(tmp_path, monkeypatch):
    """The first page's figure: M_0's curve, each arm's curve from where its members' FLOPs put it (a dotted
    run from 0), M_0's final loss as a horizontal line and each arm's crossing of it marked where the
    comparison puts it, with its cost ratio in the legend below the panel; drawn at the page's width."""
    from growlm.report import answer_figure
    from growlm.report.figures import FIRST_PAGE_INCHES

    combos, paths = make_experiment(tmp_path, {"0.001": [8, 6, 5.0]}, {"0.001": [6, 5, 4.0]}, seeds=(0, 1))
    monkeypatch.setattr("growlm.compare.unigram_loss", lambda *a, **k: 7.0)
    monkeypatch.setattr("growlm.compare.load_tokens", lambda p: np.zeros(4, dtype=np.uint16))
    table = write_comparison(combos, paths, comparison_csv=tmp_path / "c.csv", curves_csv=tmp_path / "k.csv",
                             unigram_train="x", unigram_test="y", vocab_size=8)
    fig = answer_figure(tmp_path / "k.csv", tmp_path / "c.csv")
    fig.canvas.draw()
    (ax,) = [a for a in fig.axes if a.get_visible()]
    assert fig.get_figwidth() == FIRST_PAGE_INCHES
    m0_final = table["m0_final_val_loss"].mean()  # 5.005: the two seeds' 5.0 and 5.01
    lines = ax.get_lines()
    assert any(list(line.get_ydata()) == [m0_final, m0_final] and line.get_linestyle() == "--" for line in lines)
    m0 = [line for line in lines if line.get_label() == "M_0, from scratch"]
    assert len(m0) == 1 and list(m0[0].get_xdata()) == [0, 100, 200]  # M_0 starts at 0
    # the arm: its members' 50 FLOPs spent before it starts, dotted at its first loss (mean 6.005)
    start = [line for line in lines if line.get_linestyle() == ":"]
    assert len(start) == 1 and list(start[0].get_xdata()) == [0, 50] and \
        list(start[0].get_ydata()) == pytest.approx([6.005, 6.005])
    arm = [line for line in lines if line.get_label().startswith("g: ")]
    assert len(arm) == 1 and list(arm[0].get_xdata()) == [50, 150, 250]
    # where it first reaches M_0's final loss: the comparison's crossing, at its cost ratio
    cross = [line for line in lines if line.get_marker() == "X"]
    assert len(cross) == 1 and list(cross[0].get_xdata()) == [50 + table["m1_flops_to_m0_loss"].mean()]
    assert list(cross[0].get_ydata()) == [m0_final]
    assert arm[0].get_label() == f"g: M_0's loss at {table['cost_ratio'].mean():.2f}x M_0's FLOPs" == \
        "g: M_0's loss at 0.75x M_0's FLOPs"
    legend = ax.get_legend()
    assert legend.get_window_extent().y1 < ax.get_window_extent().y0  # below the panel, off the curves


def test_weight_decay_is_tuned_beside_the_rate_and_named_apart(tmp_path, monkeypatch):
    """An `lr` value may name a weight decay (growlm.experiment.optim_id): M_0 is compared at the setting
    with its lowest mean final loss, and the comparison gives its rate and weight decay in columns of their own."""
    m0 = {"0.002": [8, 6, 4.5, 4.0], "0.002_wd1": [8, 6, 4.4, 3.8]}
    m1 = {"0.002": [6, 5, 4.2, 3.9], "0.002_wd1": [6, 5.5, 5, 4.8]}
    combos, paths = make_experiment(tmp_path, m0, m1)
    for seed in (0, 1):
        for lr, wd in (("0.002", 0.1), ("0.002_wd1", 1.0)):
            for arm in ("baseline", "refined/g"):
                config = TrainConfig(tokens=1000, batch_size=1, lr=0.002, warmup_steps=0, weight_decay=wd).to_dict()
                (tmp_path / arm / f"t1000_lr{lr}" / f"s{seed}" / "growlm.json").write_text(
                    json.dumps({"train": {"config": config}}))
    m0_best, m1_best, table = choose_learning_rates(combos, paths)
    assert m0_best == {("16", "2", "1000"): "0.002_wd1"} and set(m1_best.values()) == {"0.002"}
    assert sorted(table[table["arm"] == "M_0"]["weight_decay"]) == [0.1, 1.0]
    monkeypatch.setattr("growlm.compare.unigram_loss", lambda *a, **k: 7.0)
    monkeypatch.setattr("growlm.compare.load_tokens", lambda p: np.zeros(4, dtype=np.uint16))
    out = write_comparison(combos, paths, comparison_csv=tmp_path / "c.csv", curves_csv=tmp_path / "k.csv",
                           unigram_train="x", unigram_test="y", vocab_size=8, lr_sweep_csv=tmp_path / "s.csv")
    row = out[out["seed"] == 0].iloc[0]
    assert (row["m0_lr"], row["m0_weight_decay"], row["m1_lr"], row["m1_weight_decay"]) == ("0.002", 1.0, "0.002", 0.1)
    assert row["m0_final_val_loss"] == 3.8


def branch(model_dir, point, losses, left_at, flops_per_eval=100.0, cooldown=60.0):
    """A cooldown branch of a model: the model's ledger up to row `left_at`, then `losses` at the next FLOPs."""
    full = pd.read_csv(model_dir / "ledger.csv")
    rows = full.iloc[:left_at + 1].to_dict("records")
    for i, loss in enumerate(losses, start=1):
        flops = rows[left_at]["flops"] + i * flops_per_eval * 0.3
        rows.append({**rows[left_at], "step": left_at * 100 + i, "flops": flops, "val_loss": loss})
    out = model_dir / "branches" / f"b{point}"
    out.mkdir(parents=True)
    pd.DataFrame(rows).to_csv(out / "ledger.csv", index=False)
    (out / "branch.json").write_text(json.dumps({"cooldown_flops": cooldown}))


def test_the_cost_by_envelope_reads_the_branches_and_is_below_the_first_crossing(tmp_path, monkeypatch):
    """With cooldown branches, the comparison's cost by envelope is never above its first crossing, here strictly
    below it (M_1's branch leaving at 200 FLOPs ends under M_0's final loss at 230); the cooldowns' FLOPs are
    the measurement's, charged to no arm; the saving at each loss is written. Without branches (one run per
    arm) the envelope columns are empty and the rest is what it was."""
    m0, m1 = {"0.002": [8, 6, 4.5, 4.0]}, {"0.002": [6, 5, 4.2, 3.9]}
    combos, paths = make_experiment(tmp_path, m0, m1, seeds=(0,))
    monkeypatch.setattr("growlm.compare.unigram_loss", lambda *a, **k: 7.0)
    monkeypatch.setattr("growlm.compare.load_tokens", lambda p: np.zeros(4, dtype=np.uint16))
    kw = dict(comparison_csv=tmp_path / "c.csv", curves_csv=tmp_path / "k.csv", unigram_train="x", unigram_test="y",
              vocab_size=8, savings_csv=tmp_path / "savings.csv")
    before = write_comparison(combos, paths, **kw).iloc[0]
    assert before["envelope_runs"] == "1+1" and math.isnan(before["envelope_ratio"])
    assert pd.read_csv(tmp_path / "savings.csv").empty

    m0_dir, m1_dir = tmp_path / "baseline/t1000_lr0.002/s0", tmp_path / "refined/g/t1000_lr0.002/s0"
    branch(m0_dir, "50", [4.3], left_at=2)  # M_0's branch ends above its final loss: M_0's envelope is its run
    branch(m1_dir, "50", [3.95], left_at=2)  # M_1's: at 230 FLOPs, under M_0's 4.0
    after = write_comparison(combos, paths, branches={"baseline": ["50"], "refine": ["50"]}, **kw).iloc[0]
    assert after["cost_ratio"] == before["cost_ratio"] and after["envelope_runs"] == "2+2"
    assert after["m0_envelope_flops"] == pytest.approx(300.0)
    # M_1's envelope first reaches 4.0 between its branch's start (200 + 50, 4.2) and end (230 + 50, 3.95), in log FLOPs
    expected = math.exp(math.log(250) + (4.2 - 4.0) / (4.2 - 3.95) * math.log(280 / 250))
    assert after["m1_envelope_flops"] == pytest.approx(expected)
    assert after["envelope_ratio"] == pytest.approx(expected / 300)
    assert after["envelope_ratio"] < after["cost_ratio"]
    assert after["envelope_ratio_small_free"] < after["cost_ratio_small_free"]
    assert after["cooldown_flops"] == 120.0
    savings = pd.read_csv(tmp_path / "savings.csv")
    assert len(savings) and (savings["ratio"] > 0).all() and savings["loss"].min() == pytest.approx(4.0)


def test_m0s_envelope_can_reach_its_final_loss_before_its_end(tmp_path, monkeypatch):
    """M_1's envelope FLOPs are never above its first crossing, but the ratio divides them by M_0's envelope
    FLOPs to M_0's own final loss: where M_0's curve touched that loss before its last evaluation (a dip,
    then an evaluation a little higher), that is less than M_0's FLOPs, and the envelope ratio can be above
    the within-schedule one (seed 2 at 8 tokens per parameter in bench/RESULTS.md 15)."""
    m0, m1 = {"0.002": [8, 6, 3.95, 4.0]}, {"0.002": [6, 5, 4.2, 3.9]}
    combos, paths = make_experiment(tmp_path, m0, m1, seeds=(0,))
    monkeypatch.setattr("growlm.compare.unigram_loss", lambda *a, **k: 7.0)
    monkeypatch.setattr("growlm.compare.load_tokens", lambda p: np.zeros(4, dtype=np.uint16))
    branch(tmp_path / "baseline/t1000_lr0.002/s0", "50", [5.5], left_at=1)  # ends above 4.0: no new crossing
    branch(tmp_path / "refined/g/t1000_lr0.002/s0", "50", [4.6], left_at=1)
    row = write_comparison(combos, paths, comparison_csv=tmp_path / "c.csv", curves_csv=tmp_path / "k.csv",
                           unigram_train="x", unigram_test="y", vocab_size=8,
                           branches={"baseline": ["50"], "refine": ["50"]}).iloc[0]
    first_crossing = row["cost_ratio"] * row["m0_flops"]  # M_1's first crossing in its own run, members counted
    assert row["m1_envelope_flops"] <= first_crossing
    # M_0 reaches 4.0 between (100, 6) and (200, 3.95), read in log FLOPs: before its 300
    assert row["m0_envelope_flops"] == pytest.approx(100 * 2 ** ((6 - 4.0) / (6 - 3.95)))
    assert row["envelope_ratio"] == pytest.approx(row["m1_envelope_flops"] / row["m0_envelope_flops"])
    assert row["envelope_ratio"] > row["cost_ratio"]


def test_under_the_cosine_a_budget_sweep_makes_the_envelope(tmp_path, monkeypatch):
    """Each budget's run is one of an arm's runs: at the longer budget, M_1's shorter run (which ended, annealed,
    lower than its longer run was at the same FLOPs) makes M_1's envelope reach M_0's final loss sooner."""
    paths = {k: (v.replace("{root}", str(tmp_path)) if v else v) for k, v in PATHS.items()}
    grown = tmp_path / "grown" / "g" / "s0"
    grown.mkdir(parents=True)
    (grown / "growth.json").write_text(json.dumps(
        {"members": [{"dir": str(tmp_path / "small/m1"), "flops": 50.0, "wall_s": 1.0}], "growth_flops": 0}))
    ledger(tmp_path / "small" / "m1", [9.0, 8.0])
    curves = {("baseline", 1000): [8, 6, 5.0], ("baseline", 2000): [8, 6.5, 5.5, 4.8, 4.0],
              ("refined/g", 1000): [6, 5, 3.95], ("refined/g", 2000): [6, 5.2, 4.6, 4.3, 3.9]}
    combos = []
    for (arm, budget), losses in curves.items():
        ledger(tmp_path / arm / f"t{budget}_lr0.002" / "s0", losses)
        if arm == "baseline":
            M0_CONFIG.to_json_file(tmp_path / arm / f"t{budget}_lr0.002" / "s0" / "config.json")
            combos.append({"d0": 8, "L0": 1, "d1": 16, "L1": 2, "n": 1, "method": "g", "seed": 0, "budget": budget,
                           "lr": "0.002"})
    monkeypatch.setattr("growlm.compare.unigram_loss", lambda *a, **k: 7.0)
    monkeypatch.setattr("growlm.compare.load_tokens", lambda p: np.zeros(4, dtype=np.uint16))
    out = write_comparison(combos, paths, comparison_csv=tmp_path / "c.csv", curves_csv=tmp_path / "k.csv",
                           unigram_train="x", unigram_test="y", vocab_size=8, savings_csv=tmp_path / "s.csv")
    long = out[out["budget"] == 2000].iloc[0]
    assert long["envelope_runs"] == "2+2"
    # M_0 ends at 4.0 (400 FLOPs); M_1's 2000-token run reaches 4.0 only after 300 of its own FLOPs (4.3 -> 3.9),
    # its annealed 1000-token run between 100 (5.0) and 200 (3.95): with the member's 50, read in log FLOPs
    assert long["m1_envelope_flops"] == pytest.approx(150 * (250 / 150) ** ((5 - 4) / (5 - 3.95)), rel=1e-9)
    assert long["envelope_ratio"] == pytest.approx(long["m1_envelope_flops"] / 400)
    assert long["envelope_ratio"] < 0.65 < long["cost_ratio"]
