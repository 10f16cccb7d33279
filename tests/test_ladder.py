"""bench/ladder.py (RESULTS 16), without training: each rung's budget is 8 tokens per non-embedding parameter of the
model growlm builds at that size, every folder's config validates, and the prediction refuses to run on too little."""

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import validated_config

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
import ladder  # noqa: E402

sys.path.remove(str(REPO / "bench"))


@pytest.mark.parametrize("d1", [24, 32, 48, 64])
def test_a_rung_is_8_tokens_per_parameter_of_the_model_growlm_builds(d1):
    from growlm.model import build_model, n_params

    s = ladder.size(d1)
    assert (s["d0"], s["L0"], s["L1"]) == (d1 // 2, 2, 4)
    model = build_model(seed=0, n_embd=d1, n_layer=4, vocab_size=2048, n_positions=128,
                        head_dim=ladder.model_settings()["head_dim"])
    n = n_params(model, non_embedding=True)
    assert ladder.params(d1, 4) == n
    assert s["budget"] % ladder.BATCH_TOKENS == 0
    assert abs(s["budget"] - 8 * n) <= ladder.BATCH_TOKENS / 2  # rounded to whole batches
    member = build_model(seed=0, n_embd=d1 // 2, n_layer=2, vocab_size=2048, n_positions=128,
                         head_dim=ladder.model_settings()["head_dim"])
    assert s["small_tokens"] >= 6 * n_params(member, non_embedding=True) - ladder.BATCH_TOKENS / 2
    assert s["ramp_steps"] == round(0.05 * s["budget"] / ladder.BATCH_TOKENS)


@pytest.mark.parametrize("arm", list(ladder.ARMS))
def test_every_folder_config_validates(arm):
    overlays = [yaml.safe_load(p.read_text()) for p in ladder.OVERLAYS[1:]]
    s = ladder.size(48)
    config = validated_config(*overlays, ladder.merge(ladder.size_overlay(s), ladder.ARMS[arm]["overlay"]))
    assert config["experiment"] == "default" and config["baseline"]["extend"] == ladder.EXTEND
    assert config["budgets"] == [s["budget"]] and config["d1"] == [48] and config["d0"] == [24]
    assert config["train"]["refine"]["branches"] == []
    assert len(config["corpus"]["sources"]) > 300  # the large corpus, not the bundled readers
    assert config["grow"]["options"]["msg"]["ramp_steps"] == s["ramp_steps"]


def test_a_second_budget_has_folders_of_its_own(tmp_path):
    """The lever's member and every grown model are named without the budget: a budget other than the ladder's own
    trains in folders of its own, and the summary finds each size at its budget."""
    eight, twenty = ladder.size(32), ladder.size(32, 20)
    assert twenty["budget"] == pytest.approx(2.5 * eight["budget"], rel=0.01)
    names = {ladder.folder(tmp_path, s, arm).name for s in (eight, twenty) for arm in ladder.ARMS.values()}
    assert names == {"run_ladder_d32_base", "run_ladder_d32_share0.1", "run_ladder_d32_tpp20_base",
                     "run_ladder_d32_tpp20_share0.1"}
    for name in names:
        (tmp_path / name).mkdir()
    found = {(s["d1"], s["tpp"], s["budget"]) for s in ladder.finished_sizes(tmp_path)}
    assert found == {(32, 8, eight["budget"]), (32, 20, twenty["budget"])}


def _run(*args, cwd=REPO):
    return subprocess.run([sys.executable, str(REPO / "bench" / "ladder.py"), *args], cwd=cwd, capture_output=True,
                          text=True, env={"PYTHONPATH": str(REPO / "workflow" / "scripts"), "PATH": "/usr/bin:/bin"})


def test_a_width_whose_member_has_no_whole_heads_is_refused():
    proc = _run("--sizes", "30", "--root", "/nonexistent")
    assert proc.returncode == 2 and "widths [30]" in proc.stderr and "head size" in proc.stderr


def test_predict_needs_two_finished_sizes_below_it(tmp_path, monkeypatch):
    monkeypatch.setattr(ladder, "OUT", tmp_path)
    with pytest.raises(SystemExit) as err:
        ladder.main(["--predict", "64"])
    assert err.value.code == 2
    (tmp_path / "ladder_seeds.csv").write_text("d1,arm\n24,msg\n64,msg\n")
    with pytest.raises(SystemExit) as err:
        ladder.main(["--predict", "64"])
    assert err.value.code == 2
