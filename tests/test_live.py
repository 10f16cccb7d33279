"""Live training curves (`train.log_to`): every training job of the tiny run (tests/config/tiny.yaml logs
to TensorBoard) wrote its curve under results/tiny/live/, against cumulative training FLOPs with an
M_1's members counted, and the numbers agree with the ledger, which stays the source of every
reported number."""

from __future__ import annotations

import json
import time

import pandas as pd
import pytest

pytest.importorskip("tensorboard", reason="tensorboard is growlm's eval extra (setup.sh installs it)")


def curves(run_dir) -> dict[str, list[tuple[int, float]]]:
    """{tag: [(step, value)]} of a TensorBoard run folder, read with TensorBoard's own reader."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


@pytest.mark.slow
def test_every_model_of_the_tiny_run_has_its_live_curve(tiny_run):
    res = tiny_run / "results" / "tiny"
    models = sorted(p.parent for kind in ("small", "baseline", "refined")
                    for p in (res / "models" / kind).glob("**/model.safetensors"))
    assert len(models) == 6  # two members, M_0, three M_1
    for model in models:
        name = model.relative_to(res / "models")
        run = res / "live" / name
        assert list(run.glob("events.out.tfevents.*")), f"no live curve for {name}"
        got = curves(run)
        assert {"loss/val", "loss/train", "train/lr", "train/tokens_per_s", "cost/flops"} <= set(got), (name, got)
        ledger = pd.read_csv(model / "ledger.csv")
        evals = ledger[ledger["kind"] == "eval"]
        offset = 0.0
        if name.parts[0] == "refined":  # an M_1 starts where its members' and growth's cost ends
            growth = json.loads((res / "models" / "grown" / name.parts[1] / name.parts[2] / name.parts[3] / name.parts[5]
                                 / "growth.json").read_text())
            members = [m for m in growth["members"] if m.get("role") != "trunk"]
            offset = sum(m["flops"] for m in members) + growth.get("growth_flops", 0)
            assert offset > 0
        # the validation losses, at the ledger's FLOPs plus the offset: the ledger's numbers exactly
        assert [s for s, _ in got["loss/val"]] == [int(round(offset + f)) for f in evals["flops"]]
        assert [v for _, v in got["loss/val"]] == pytest.approx(list(evals["val_loss"]), abs=1e-5)  # float32
        assert got["cost/flops"][0][0] == int(round(offset))
        assert all(v > 0 for _, v in got["train/tokens_per_s"])


@pytest.mark.slow
def test_changing_log_to_reruns_nothing(tiny_run, tmp_path):
    from conftest import TINY, plan

    (tmp_path / "no_live.yaml").write_text("train: {log_to: []}\n")
    assert plan(tiny_run, configfiles=(TINY, tmp_path / "no_live.yaml")) == (None, [])  # in this process


def test_a_resumed_run_hides_the_points_it_redoes(tmp_path):
    """A job that resumes from a checkpoint writes its first point after the checkpoint's step with
    a purge at that point, so TensorBoard shows the earlier run's curve up to there and the resumed
    run's from there; a run that starts over removes the earlier events."""
    from growlm.live import LiveCurves

    def row(step, loss):
        return {"step": step, "tokens": 100 * step, "flops": 10 * step, "wall_s": float(step), "lr": 1e-3,
                "train_loss": loss, "val_loss": loss}

    first = LiveCurves(to=["tensorboard"], run_dir=tmp_path / "run", name="m", group="g", offset_flops=5)
    for step, loss in ((0, 9.0), (2, 8.0), (4, 7.0)):
        first.row(row(step, loss))
    first.close()
    resumed = LiveCurves(to=["tensorboard"], run_dir=tmp_path / "run", name="m", group="g", offset_flops=5)
    for step, loss in ((4, 6.5), (6, 6.0)):
        resumed.row(row(step, loss))
    resumed.close()
    assert curves(tmp_path / "run")["loss/val"] == [(5, 9.0), (25, 8.0), (45, 6.5), (65, 6.0)]
    again = LiveCurves(to=["tensorboard"], run_dir=tmp_path / "run", name="m", group="g")
    again.row(row(0, 9.5))
    again.close()
    assert curves(tmp_path / "run")["loss/val"] == [(0, 9.5)]


def test_wandb_logs_offline_into_the_run_folder(tmp_path, monkeypatch):
    """With wandb installed (not part of growlm's extras), `wandb` in train.log_to writes an offline
    run (no account, no network) inside the model's live folder, named by the model's path."""
    pytest.importorskip("wandb", reason="wandb is optional (pip install wandb)")
    from growlm.live import LiveCurves

    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    live = LiveCurves(to=["wandb"], run_dir=tmp_path / "run", name="baseline/d32_L2/s0", group="tiny",
                      offset_flops=100)
    live.row({"step": 0, "tokens": 0, "flops": 0, "wall_s": 0.0, "lr": 1e-3, "train_loss": "", "val_loss": 5.0})
    live.row({"step": 4, "tokens": 400, "flops": 40, "wall_s": 1.0, "lr": 1e-3, "train_loss": 4.6, "val_loss": 4.5})
    live.close()
    [run] = (tmp_path / "run" / "wandb").glob("offline-run-*")
    [records] = run.glob("*.wandb")
    for _ in range(60):  # wandb's service process writes the records after finish() returns
        if b"loss/val" in records.read_bytes():
            break
        time.sleep(0.5)
    assert b"loss/val" in records.read_bytes() and b"baseline/d32_L2/s0" in records.read_bytes()
