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
    (out / "branch.json").write_text(json.dumps({"cooldown_flops": cooldown, "fraction": int(point) / 100,
                                                 "step": left_at}))


def test_the_cost_by_envelope_reads_the_branches_finished_runs(tmp_path, monkeypatch):
    """With cooldown branches, the comparison's cost by envelope reads each arm's finished runs - its full run's
    end and each branch's - joined by their lower hull in log FLOPs (too few to fit a curve): here below the
    first crossing inside M_1's run; the cooldowns' FLOPs are the measurement's, charged to no arm; the saving
    at each loss both envelopes' ends span is written. Without branches (one run per arm) the envelope columns
    are empty and the rest is what it was."""
    m0, m1 = {"0.002": [8, 6, 4.5, 4.0]}, {"0.002": [6, 5, 4.2, 3.9]}
    combos, paths = make_experiment(tmp_path, m0, m1, seeds=(0,))
    monkeypatch.setattr("growlm.compare.unigram_loss", lambda *a, **k: 7.0)
    monkeypatch.setattr("growlm.compare.load_tokens", lambda p: np.zeros(4, dtype=np.uint16))
    kw = dict(comparison_csv=tmp_path / "c.csv", curves_csv=tmp_path / "k.csv", unigram_train="x", unigram_test="y",
              vocab_size=8, savings_csv=tmp_path / "savings.csv")
    before = write_comparison(combos, paths, **kw).iloc[0]
    assert before["envelope_runs"] == "1+1" and math.isnan(before["envelope_ratio"])
    assert pd.read_csv(tmp_path / "savings.csv").empty
    assert math.isnan(before["multiplier"]) and "1 distinct compute values" in before["m0_fit_why"]  # one run: no fit

    m0_dir, m1_dir = tmp_path / "baseline/t1000_lr0.002/s0", tmp_path / "refined/g/t1000_lr0.002/s0"
    branch(m0_dir, "50", [4.3], left_at=2)  # M_0's branch ends at 230 FLOPs above its final loss
    branch(m1_dir, "50", [4.1], left_at=2)  # M_1's at 230 (+ 50, its member) at 4.1, its full run at 300 (+ 50) at 3.9
    after = write_comparison(combos, paths, branches={"baseline": ["50"], "refine": ["50"]}, **kw).iloc[0]
    assert after["cost_ratio"] == before["cost_ratio"] and after["envelope_runs"] == "2+2"
    assert after["m0_envelope_flops"] == pytest.approx(300.0)
    # M_1's hull reaches 4.0 halfway from its branch's end (280, 4.1) to its full run's (350, 3.9), in log FLOPs
    assert after["m1_envelope_flops"] == pytest.approx(math.sqrt(280 * 350))
    assert after["envelope_ratio"] == pytest.approx(math.sqrt(280 * 350) / 300)
    assert after["envelope_ratio"] < after["cost_ratio"]
    assert after["envelope_ratio_small_free"] == pytest.approx(math.sqrt(230 * 300) / 300)
    assert after["cooldown_flops"] == 120.0 and after["envelope_joined"] == "hull"
    savings = pd.read_csv(tmp_path / "savings.csv")
    # the losses both arms' finished runs span: from M_0's 4.0 to M_1's 4.1
    assert len(savings) and (savings["ratio"] > 0).all()
    assert savings["loss"].min() == pytest.approx(4.0) and savings["loss"].max() == pytest.approx(4.1)
    curves = pd.read_csv(tmp_path / "k.csv")
    runs = curves[curves["arm"] == "M_1 (g)"].groupby("run")
    # a branch's rows are its own (after it left the full run); each run's last evaluation is its end
    assert runs.size().to_dict() == {"branch 0.5": 1, "full": 4}
    assert curves[curves["is_end"]].groupby("arm")["run"].apply(sorted).to_dict()["M_1 (g)"] == ["branch 0.5", "full"]


def test_a_point_inside_m0s_run_is_not_a_run_that_ended_there(tmp_path, monkeypatch):
    """M_0's curve touching its final loss before its last evaluation (a dip, then a last evaluation a little
    higher) does not count: M_0's envelope is made of runs that ended, so it reaches M_0's final loss at M_0's own
    FLOPs (the first measurement of bench/RESULTS.md 15 divided by such a point, which leaned against growth)."""
    m0, m1 = {"0.002": [8, 6, 3.95, 4.0]}, {"0.002": [6, 5, 4.2, 3.9]}
    combos, paths = make_experiment(tmp_path, m0, m1, seeds=(0,))
    monkeypatch.setattr("growlm.compare.unigram_loss", lambda *a, **k: 7.0)
    monkeypatch.setattr("growlm.compare.load_tokens", lambda p: np.zeros(4, dtype=np.uint16))
    branch(tmp_path / "baseline/t1000_lr0.002/s0", "50", [5.5], left_at=1)  # ends above 4.0
    branch(tmp_path / "refined/g/t1000_lr0.002/s0", "50", [4.6], left_at=1)
    row = write_comparison(combos, paths, comparison_csv=tmp_path / "c.csv", curves_csv=tmp_path / "k.csv",
                           unigram_train="x", unigram_test="y", vocab_size=8,
                           branches={"baseline": ["50"], "refine": ["50"]}).iloc[0]
    assert row["m0_envelope_flops"] == pytest.approx(row["m0_flops"]) == pytest.approx(300)
    # M_1's ends: its branch's (130 + 50, 4.6) and its run's (300 + 50, 3.9), read in log FLOPs
    assert row["m1_envelope_flops"] == pytest.approx(180 * (350 / 180) ** ((4.6 - 4.0) / (4.6 - 3.9)))
    assert row["envelope_ratio"] == pytest.approx(row["m1_envelope_flops"] / 300)


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
    # M_0's runs end at (200, 5.0) and (400, 4.0); M_1's 1000-token run, annealed, ended at 3.95 after 200 of its
    # own FLOPs and its member's 50: the smallest of M_1's finished runs already below M_0's 4.0
    assert long["m1_envelope_flops"] == pytest.approx(250)
    assert long["envelope_ratio"] == pytest.approx(250 / 400)
    assert long["envelope_ratio"] < 0.65 < long["cost_ratio"]


def test_the_multiplier_reads_m0s_finished_runs_over_the_seeds(tmp_path, monkeypatch):
    """Each arm's effective compute multiplier: M_0's finished runs (its full run's end and its branches', three
    seeds pooled) fitted with L(C) = E + A C^-alpha, and the FLOPs that curve needs for M_1's mean final loss over
    M_1's FLOPs with its member counted (and free); the same on each seed's row, with each seed's own beside it.
    M_1 ends below every run of M_0: the multiplier is an extrapolation, and says by how much."""
    from growlm.multiplier import fit_power_law

    def law(c):
        return 2.0 + 50.0 * c ** -0.5

    seeds = (0, 1, 2)
    m0 = {"0.002": [8, 6, 5.5, law(300)]}
    m1 = {"0.002": [6, 5, 4.9, 4.8]}
    combos, paths = make_experiment(tmp_path, m0, m1, seeds=seeds)
    monkeypatch.setattr("growlm.compare.unigram_loss", lambda *a, **k: 7.0)
    monkeypatch.setattr("growlm.compare.load_tokens", lambda p: np.zeros(4, dtype=np.uint16))
    for seed in seeds:
        base = tmp_path / f"baseline/t1000_lr0.002/s{seed}"
        branch(base, "20", [law(130) + 0.01 * seed], left_at=1)  # ends at 130 FLOPs
        branch(base, "50", [law(230) + 0.01 * seed], left_at=2)  # at 230
    table = write_comparison(combos, paths, comparison_csv=tmp_path / "c.csv", curves_csv=tmp_path / "k.csv",
                             unigram_train="x", unigram_test="y", vocab_size=8,
                             branches={"baseline": ["20", "50"], "refine": []})
    assert len(table) == 3 and table["multiplier"].nunique() == 1
    row = table.iloc[0]
    ends = [(f, law(f) + 0.01 * s) for s in seeds for f in (130.0, 230.0, 300.0)]
    fit = fit_power_law([f for f, _ in ends], [v for _, v in ends])
    m1_loss = np.mean([4.8 + 0.01 * s for s in seeds])
    assert row["multiplier"] == pytest.approx(fit.compute_for(m1_loss) / 350.0, rel=1e-6)  # 300 + the member's 50
    assert row["multiplier_free"] == pytest.approx(fit.compute_for(m1_loss) / 300.0, rel=1e-6)
    assert row["m0_points"] == 9 and row["m0_seeds"] == 3 and row["m1_seeds"] == 3
    assert row["multiplier_low"] < row["multiplier"] < row["multiplier_high"]
    assert row["saving"] == ("saving" if row["multiplier_low"] > 1 else
                             "costs more" if row["multiplier_high"] < 1 else "no measurable saving")
    # M_1's 4.81 lies below M_0's lowest finished run (its 300-FLOPs end): read past it
    assert bool(row["extrapolated"]) and row["extrapolation_factor"] == pytest.approx(fit.compute_for(m1_loss) / 300.0,
                                                                                    rel=1e-6)
    for _, r in table.iterrows():
        assert r["seed_multiplier"] == pytest.approx(fit.compute_for(4.8 + 0.01 * r["seed"]) / 350.0, rel=1e-6)
    curves = pd.read_csv(tmp_path / "k.csv")
    ends_kept = curves[(curves["arm"] == "M_0 (scratch)") & curves["is_end"]]
    assert sorted(set(ends_kept["run"])) == ["branch 0.2", "branch 0.5", "full"]


def test_the_first_page_states_the_multiplier_and_its_verdict(tmp_path):
    """The report's first page gives each arm's multiplier with its interval, and states a saving only where the
    whole interval lies above 1; one that holds 1 is 'no measurable saving'."""
    from growlm.report.summary import summary_sentences

    base = {"d0": 8, "L0": 1, "d1": 16, "L1": 2, "n": 1, "budget": 1000, "arm": "grown from n members",
            "members_used": 1, "reached": True, "m0_final_val_loss": 4.0, "m1_final_val_loss": 3.95,
            "cost_ratio": 0.9, "cost_ratio_small_free": 0.85, "members_cost": "counted",
            "multiplier_free": 1.2, "multiplier_free_low": 1.05, "multiplier_free_high": 1.4, "m1_seeds": 3,
            "extrapolated": False, "extrapolation_factor": 1.0}
    rows = [{**base, "method": "msg", "seed": s, "multiplier": 1.1, "multiplier_low": 0.95, "multiplier_high": 1.3,
             "saving": "no measurable saving"} for s in range(3)]
    rows += [{**base, "method": "concat", "seed": s, "multiplier": 1.3, "multiplier_low": 1.1, "multiplier_high": 1.5,
              "saving": "saving", "extrapolated": True, "extrapolation_factor": 2.5} for s in range(3)]
    pd.DataFrame(rows).to_csv(tmp_path / "c.csv", index=False)
    text = "\n".join(summary_sentences(tmp_path / "c.csv"))
    assert ("**msg** (grown from 1 members): no measurable saving: effective compute multiplier 1.10 (95% interval "
            "0.95-1.30) with the small model counted, over 3 seeds") in text
    assert "**concat** (grown from 1 members): growing paid: effective compute multiplier 1.30 (95% interval 1.10-1.50)" in text
    assert "1.20 (95% interval 1.05-1.40) with it free" in text
    assert "an extrapolation" in text and "by a factor of 2.50" in text
    assert text.count("growing paid") == 1  # the cost ratios' own verdict gives way to the interval's
