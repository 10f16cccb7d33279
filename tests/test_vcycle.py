"""The Multi-Level V-cycle as its authors run it (growlm.schedules.vcycle, its `run` through growlm.jobs.grow.grow_schedule): the
maps (coalesce is a left inverse of de-coalesce in both families and pairings; width de-coalescing is
exact), the stages of a V of any depth with their shares and rates, the stage-1 weights being the
ones interpolated, every stage's FLOPs in its ledger and in the growth cost, and the refinement's
recipe (a share of the budget, no re-warm-up)."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import torch

from conftest import learnable_tokens
from growlm.experiment import refine_settings
from growlm.families import family_of
from growlm.model import build_model, load_model
from growlm.schedules.vcycle import coalesce, decoalesce, groups, interpolate, vcycle_plan
from growlm.shape import ModelShape

V, T = 61, 16


def model(seed: int, d: int, L: int, family: str = "gpt2", tied: bool = True):
    extra = {"heads_per_kv": 2, "mlp_ratio": 3} if family == "llama" else {}
    return build_model(seed=seed, family=family, n_embd=d, n_layer=L, vocab_size=V, n_positions=T, head_dim=8,
                       tie_word_embeddings=tied, **extra).double().eval()


def logits(m, x):
    with torch.no_grad():
        return m(input_ids=x).logits


def weights(m) -> dict:
    return {k: v for k, v in m.state_dict().items()}


def test_the_pairings_merge_what_the_authors_merge():
    assert groups(12, 2, "stride").tolist() == [[i, i + 6] for i in range(6)]  # layer i with i + L/2
    assert groups(4, 2, "adjacent").tolist() == [[0, 1], [2, 3]]
    assert groups(8, 2, "stride", chunk=2).tolist() == [[0, 4], [1, 5], [2, 6], [3, 7]]


@pytest.mark.parametrize("embeddings", ["mean", "sum"])
@pytest.mark.parametrize("pairing", ["stride", "adjacent"])
@pytest.mark.parametrize("family,tied", [("gpt2", True), ("gpt2", False), ("llama", False), ("llama", True)])
def test_coalesce_is_a_left_inverse_of_decoalesce(family, tied, pairing, embeddings):
    """De-coalesce a coarse model (twice: a three-level V), coalesce it back: the coarse weights exactly."""
    small = model(1, 16 if family == "gpt2" else 32, 2, family, tied)
    up = decoalesce(small, factor=2, pairing=pairing, embeddings=embeddings)
    up2 = decoalesce(up, factor=2, pairing=pairing, embeddings=embeddings)
    s = ModelShape.of(up2)
    assert (s.d, s.L, s.dh, s.r) == (4 * ModelShape.of(small).d, 8, 8, ModelShape.of(small).r)
    back = coalesce(coalesce(up2, factor=2, pairing=pairing, embeddings=embeddings), factor=2, pairing=pairing,
                    embeddings=embeddings)
    a, b = weights(back), weights(small)
    assert a.keys() == b.keys() and all(float((a[k] - b[k]).abs().max()) < 1e-12 for k in a)
    if embeddings == "mean":  # width de-coalescing is exact (copies); the authors' embedding scaling is not
        wide = decoalesce(small, n_embd=s.d // 2, n_layer=2, pairing=pairing)
        x = torch.randint(0, V, (2, T), generator=torch.Generator().manual_seed(0))
        assert float((logits(wide, x) - logits(small, x)).abs().max()) < 1e-5


def test_depth_is_copied_by_pairing():
    small = model(2, 16, 2)
    fam = family_of(small)
    stacked = fam.unpack(decoalesce(small, factor=2, pairing="stride"))["blocks"]
    interleaved = fam.unpack(decoalesce(small, factor=2, pairing="adjacent"))["blocks"]
    src = fam.unpack(small)["blocks"]
    f0 = src[0]["fc_b"].numel()

    def same(a, b):  # the bias of the MLP's units: copied (its first f0 units are the source's)
        return torch.equal(a["fc_b"][:f0], b["fc_b"])

    assert [same(stacked[i], src[i % 2]) for i in range(4)] == [True] * 4  # 1, 2, 1, 2
    assert [same(interleaved[i], src[i // 2]) for i in range(4)] == [True] * 4  # 1, 1, 2, 2


def test_a_v_of_any_depth_plans_its_stages():
    two = vcycle_plan(levels=2, steps=200, stage_share=0.05, coarse_share=0.5, lr=1e-3, lr_multiplier=4)
    assert [(s["level"], s["direction"], s["steps"], s["lr"], s["warmup_steps"]) for s in two] == [
        (1, "down", 10, 1e-3, 10), (2, "bottom", 100, 4e-3, 0)]
    three = vcycle_plan(levels=3, steps=200, stage_share=0.05, coarse_share=0.5, lr=1e-3, lr_multiplier=4)
    assert [(s["level"], s["direction"]) for s in three] == [(1, "down"), (2, "down"), (3, "bottom"), (2, "up")]
    assert three[2]["lr"] == pytest.approx(16e-3) and three[1]["warmup_steps"] == 0
    # a share of 0: the initialisation is coalesced untrained (growlm's V-cycle before the authors' recipe)
    assert [s["level"] for s in vcycle_plan(levels=2, steps=200, stage_share=0.0, coarse_share=0.5, lr=1e-3,
                                            lr_multiplier=2)] == [2]


VC = {"levels": 2, "factor": 2, "pairing": "stride", "stage_share": 0.1, "coarse_share": 0.3, "lr_multiplier": 4,
      "alpha": 0.5, "embeddings": "mean", "final_share": 0.5}


def _run(tmp_path, **changes):
    from growlm.jobs.grow import grow_schedule
    from growlm.tokenizer import fit_tokenizer

    text = tmp_path / "t.txt"
    text.write_text("the cat sat on the mat\nsee the dog run to the red barn\n" * 100)
    fit_tokenizer([text], tmp_path / "tok", vocab_size=280)
    from growlm.tokenizer import vocab_size

    np.save(tmp_path / "train.npy", learnable_tokens(vocab_size(tmp_path / "tok"), 8000))
    np.save(tmp_path / "val.npy", learnable_tokens(vocab_size(tmp_path / "tok"), 2000, seed=1))
    train = {"tokens": 8 * T * 40, "batch_size": 8, "context": T, "lr": 3e-3, "warmup_steps": 4, "eval_interval": 5,
             "eval_tokens": 512, "checkpoint_every": 20, "seed": 1}
    out = tmp_path / "grown"
    grow_schedule("vcycle", {"vcycle": {**VC, **changes}, "train": train,
                             "model": {"n_embd": 32, "n_layer": 4, "n_positions": T, "head_dim": 8}},
                  seed=0, train_file=tmp_path / "train.npy", val_file=tmp_path / "val.npy",
                  tokenizer_dir=tmp_path / "tok", out_dir=out)
    return out, json.loads((out / "growth.json").read_text())


def test_the_job_trains_every_stage_and_counts_its_flops(tmp_path):
    out, growth = _run(tmp_path, levels=3)
    stages = growth["stages"]
    assert [(s["level"], s["direction"], s["width"]) for s in stages] == [(1, "down", 32), (2, "down", 16),
                                                                          (3, "bottom", 8), (2, "up", 16)]
    assert [s["steps"] for s in stages] == [4, 4, 12, 4]  # shares of the 40 steps of the reference budget
    total = 0
    for i, s in enumerate(stages, start=1):
        ledger = list(csv.DictReader(open(out / f"stage{i}_level{s['level']}_{s['direction']}" / "ledger.csv")))
        assert int(ledger[-1]["flops"]) == s["flops"] > 0 and int(ledger[-1]["step"]) == s["steps"]
        total += s["flops"]
    assert growth["growth_flops"] == total


def test_the_weights_from_before_coalescing_are_the_ones_interpolated(tmp_path):
    """alpha = 0: the grown model is exactly the large model after stage 1 (not the initialisation)."""
    out, growth = _run(tmp_path, alpha=0.0)
    from growlm.growth import load_grown

    grown = load_grown(out)
    stage1 = load_model(out / "stage1_level1_down")
    init = build_model(seed=0, n_embd=32, n_layer=4, n_positions=T, head_dim=8, vocab_size=grown.config.vocab_size)
    a, b, c = weights(grown), weights(stage1), weights(init)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], c[k]) for k in a)  # stage 1 trained it
    # and with alpha = 0.5 the grown weights are the mean of those and the de-coalesced coarse model's
    coarse = load_model(out / "stage2_level2_bottom")
    up, mixed = weights(decoalesce(coarse, factor=2)), weights(interpolate(stage1, coarse, 0.5, factor=2))
    assert all(float((mixed[k] - (b[k] + up[k]) / 2).abs().max()) < 1e-6 for k in mixed)


def test_the_refinement_follows_the_v_cycle_recipe():
    config = {"model": {"context": 16}, "vcycle": {"final_share": 0.5},
              "train": {"large": {"tokens": 1000, "lr": 1e-3, "batch_size": 4, "warmup_steps": 6},
                        "refine": {"warmup_steps": 3}, "min_lr_ratio": 0.1, "weight_decay": 0.1, "grad_clip": 1.0,
                        "eval_interval": 5, "eval_tokens": 64, "checkpoint_every": 10, "dense_log_steps": 2}}
    common = refine_settings(config, "msg", seed=0, tokens=6400, lr=1e-3)
    vc = refine_settings(config, "vcycle", seed=0, tokens=6400, lr=1e-3)
    assert (common["tokens"], common["warmup_steps"]) == (6400, 3)
    assert (vc["tokens"], vc["warmup_steps"]) == (3200, 0)  # half the budget, restarting at the peak
    config["vcycle"]["final_warmup"] = 0.1  # a tenth of the last stage's 50 steps warming up again
    assert refine_settings(config, "vcycle", seed=0, tokens=6400, lr=1e-3)["warmup_steps"] == 5
