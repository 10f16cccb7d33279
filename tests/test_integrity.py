"""Inputs and intermediates are verified: a missing, empty, truncated or altered file a job reads stops it
with one line naming the file and the command that rebuilds it; a memory plan is reused only for the
settings it was made for; a grown model with non-finite values is never saved."""

from __future__ import annotations

import json
import shutil
import sys

import numpy as np
import pytest

from conftest import TINY, learnable_tokens, plan, run_snakemake
from growlm.errors import GrowlmError
from growlm.model import build_model, load_model, save_model
from growlm.tokenizer import fit_tokenizer, load_tokenizer
from growlm.tokens import encode_file, load_tokens

# outside a workflow run (no user command in the environment) the hint is plain Snakemake's
REBUILD = "rebuild it and continue with `snakemake --cores 1 --force {path} && snakemake --cores 1`"


def flip_byte(path, at: int = -100) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))


def truncate(path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


@pytest.fixture
def token_file(tmp_path):
    text = tmp_path / "train.txt"
    text.write_text("\n".join(["the cat sat on the mat", "see the dog run", "a red hen"] * 200) + "\n")
    fit_tokenizer([text], tmp_path / "tok", vocab_size=300)
    encode_file(text, load_tokenizer(tmp_path / "tok"), tmp_path / "train.npy")
    return tmp_path / "train.npy"


@pytest.mark.parametrize("damage, why", [(truncate, "not a readable .npy"), (flip_byte, "sha256 recorded")])
def test_a_damaged_token_file_is_named_with_its_rebuild_command(token_file, damage, why):
    load_tokens(token_file)  # whole: loads
    damage(token_file)
    with pytest.raises(GrowlmError, match=why) as err:
        load_tokens(token_file)
    assert str(token_file) in str(err.value) and REBUILD.format(path=token_file) in str(err.value)


def test_a_damaged_tokenizer_is_named(tmp_path, token_file):
    (tmp_path / "tok" / "tokenizer.json").write_text('{"model": ')
    with pytest.raises(GrowlmError, match=r"tokenizer.json is damaged \(not a readable tokenizer"):
        load_tokenizer(tmp_path / "tok")


@pytest.mark.parametrize("damage", [truncate, flip_byte])
def test_damaged_model_weights_are_named(tmp_path, damage):
    model = build_model(seed=0, n_embd=16, n_layer=1, vocab_size=64, n_positions=16, head_dim=8)
    save_model(model, tmp_path / "m", extra={"role": "test"})
    load_model(tmp_path / "m")
    damage(tmp_path / "m" / "model.safetensors")
    with pytest.raises(GrowlmError, match=r"model.safetensors is damaged") as err:
        load_model(tmp_path / "m")
    assert REBUILD.format(path=tmp_path / "m" / "model.safetensors") in str(err.value)
    # without the recorded sha256, a truncated file is still caught by its format
    (tmp_path / "m" / "model.safetensors.sha256").unlink()
    if damage is truncate:
        with pytest.raises(GrowlmError, match=r"the model does not load"):
            load_model(tmp_path / "m")


def test_damaged_grown_model_is_named(tmp_path):
    from growlm.growth import grow, load_grown, save_grown

    members = [build_model(seed=i, n_embd=16, n_layer=1, vocab_size=64, n_positions=16, head_dim=8) for i in (1, 2)]
    save_grown(grow(members, "concat", n_embd=32, n_layer=1, cross="random"), tmp_path / "g")
    load_grown(tmp_path / "g")
    flip_byte(tmp_path / "g" / "growlm_grown.safetensors")
    with pytest.raises(GrowlmError, match=r"growlm_grown.safetensors is damaged"):
        load_grown(tmp_path / "g")


def test_damaged_json_and_ledgers_are_named(tmp_path):
    from growlm.compare import read_ledger
    from growlm.errors import read_json
    from growlm.report import corpus_stats_table

    bad = tmp_path / "growth.json"
    bad.write_text('{"method": "msg", "members": [')
    with pytest.raises(GrowlmError, match=r"growth.json is damaged \(not valid JSON"):
        read_json(bad)
    ledger = tmp_path / "ledger.csv"
    ledger.write_text("step,tokens\n0,0\n")
    with pytest.raises(GrowlmError, match=r"ledger.csv is damaged \(missing columns"):
        read_ledger(ledger)
    stats = tmp_path / "stats.json"
    stats.write_bytes(b"\xff\xfe garbage")
    with pytest.raises(GrowlmError, match=r"stats.json is damaged"):
        corpus_stats_table([stats], csv_file=tmp_path / "s.csv", html_file=tmp_path / "s.html")


def test_a_memory_plan_is_reused_only_for_the_settings_it_was_made_for(tmp_path):
    from growlm.runner import job_plan
    from growlm.shape import ModelShape
    from growlm.train_config import TrainConfig

    shape = ModelShape(n_embd=32, n_layer=2, n_head=4, vocab_size=128, n_positions=16)
    cfg = TrainConfig(tokens=8 * 16 * 4, batch_size=8, context=16, lr=1e-3, warmup_steps=0)
    messages = []
    first, path = job_plan(shape, cfg, tmp_path, memory_limit_gb=1, log=messages.append)
    again, _ = job_plan(shape, cfg, tmp_path, memory_limit_gb=1, log=messages.append)
    assert again == first and "memory plan from the previous attempt" in messages[-1]
    # another batch size, another memory cap, another model: a new plan, not the old one
    for changed_cfg, cap, changed_shape in ((cfg.with_(batch_size=4), 1, shape), (cfg, 2, shape),
                                            (cfg, 1, shape.resized(n_embd=64, n_layer=2, n_head=8))):
        messages.clear()
        plan, _ = job_plan(changed_shape, changed_cfg, tmp_path, memory_limit_gb=cap, log=messages.append)
        assert "made for other settings" in messages[0]
        assert plan.global_batch == changed_cfg.batch_size and plan.made_for["memory_limit_gb"] == cap
    path.write_text("{not json")
    messages.clear()
    plan, _ = job_plan(shape, cfg, tmp_path, memory_limit_gb=1, log=messages.append)
    assert "ignoring the memory plan" in messages[0] and plan.global_batch == 8


def test_a_grown_model_with_non_finite_values_stops_the_grow_job(tmp_path):
    from growlm.jobs.grow import grow as grow_job

    np.save(tmp_path / "t.npy", learnable_tokens(64))
    for i in (1, 2):
        model = build_model(seed=i, n_embd=16, n_layer=1, vocab_size=64, n_positions=16, head_dim=8)
        save_model(model, tmp_path / f"m{i}", extra={"train": {"flops": 1, "wall_s": 1.0}})
    with pytest.raises(GrowlmError, match=r"hyperclone\+zero_block with noise=1e\+39 grew a model with non-finite "
                                          r"values .*nothing was saved"):
        grow_job(member_dirs=[tmp_path / "m1", tmp_path / "m2"], method="hyperclone+zero_block", n_embd=32,
                 n_layer=2, seed=0, options={"noise": 1e39}, out_dir=tmp_path / "g", data_file=tmp_path / "t.npy")
    assert not (tmp_path / "g" / "growth.json").exists()
    grow_job(member_dirs=[tmp_path / "m1", tmp_path / "m2"], method="hyperclone+zero_block", n_embd=32, n_layer=2,
             seed=0, options={"noise": 0.1}, out_dir=tmp_path / "g", data_file=tmp_path / "t.npy")
    assert json.loads((tmp_path / "g" / "growth.json").read_text())["options"] == {"noise": 0.1}


@pytest.mark.slow
def test_a_workflow_run_names_a_damaged_input_in_one_line(tiny_run, tmp_path):
    """In the real workflow: a member's weights altered after they were written; the run stops before any
    job (so Snakemake deletes nothing it would rerun) with one line (no traceback) naming the file and the
    user's own command that rebuilds it (tests/test_own_results.py runs such hints)."""
    wd = tmp_path / "wf"
    shutil.copytree(tiny_run, wd, symlinks=True)
    weights = "results/tiny/models/small/d16_L1/s0/m1/model.safetensors"
    metrics = wd / "results/tiny/eval/small/d16_L1/s0/m1/metrics.json"
    flip_byte(wd / weights, at=-7)
    # the target first: --configfile and --forcerun take several values and would swallow it
    proc = run_snakemake(wd, "results/tiny/eval/small/d16_L1/s0/m1/metrics.json", "--cores", "1", "--configfile",
                         str(TINY), "--forcerun", "evaluate_model", check=False)
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0
    line = f"{weights} is damaged (its content differs from the sha256 recorded when it was written); rebuild it " \
           f"and continue with `{sys.executable} -m snakemake --cores 1 --configfile {TINY} --force {weights} && "
    assert line in text, text[-3000:]
    assert "Traceback (most recent call last)" not in text
    assert metrics.is_file()  # the job that reads the weights never started


def test_missing_and_empty_sources_are_named_at_every_run(workflow_dir):
    """A configured source must exist and hold text, checked when the Snakefile is parsed (every run,
    not only the first; here in this process, conftest's `plan`)."""
    (workflow_dir / "empty.txt").write_text("")
    overlay = workflow_dir / "sources.yaml"
    overlay.write_text("corpus:\n  sources:\n"
                       "    - {name: a, level: 0, bundled: pg14642_mcguffey_eclectic_primer.txt}\n"
                       "    - {name: b, level: 1, path: empty.txt}\n"
                       "    - {name: c, level: 1, path: no_such_book.txt}\n")
    text, _ = plan(workflow_dir, configfiles=(overlay,))
    assert text is not None
    assert "corpus.sources[1] (b): path 'empty.txt': the file is empty" in text, text
    assert "corpus.sources[2] (c): path 'no_such_book.txt': no such file" in text


@pytest.mark.slow
def test_sources_stay_checked_once_results_exist(tiny_run, tmp_path):
    """The check runs at every parse: a book removed after the corpus was built still stops the run (planned
    in this process, conftest's `plan`)."""
    wd = tmp_path / "wf"
    shutil.copytree(tiny_run, wd, symlinks=True)
    (wd / "workflow" / "resources").unlink()
    shutil.copytree(tiny_run / "workflow" / "resources", wd / "workflow" / "resources")
    (wd / "workflow" / "resources" / "corpus" / "pg18735_little_red_hen.txt").unlink()
    text, _ = plan(wd, configfiles=(TINY,))
    assert text is not None and "bundled 'pg18735_little_red_hen.txt': no such file" in text, text


def test_no_shell_command_noise_for_script_rules(workflow_dir):
    proc = run_snakemake(workflow_dir, "-n", "--cores", "1")
    assert "Shell command: None" not in proc.stdout + proc.stderr



@pytest.mark.slow
def test_a_token_file_whose_record_is_gone_is_named_before_any_job(tiny_run, tmp_path):
    """A token file altered and its .sha256 deleted would pass for an updated input (Snakemake sees only
    its date, and would plan M_0, the grow and refine jobs on it): the other token files have their
    records, so this one has lost its own, and the run stops before any job, naming it with the command
    that rebuilds it, which runs as printed."""
    wd = tmp_path / "wf"
    shutil.copytree(tiny_run, wd, symlinks=True)
    tokens = wd / "results/tiny/tokens/level1/train.npy"
    flip_byte(tokens)
    (wd / "results/tiny/tokens/level1/train.npy.sha256").unlink()
    proc = run_snakemake(wd, "-n", "--cores", "1", "--configfile", str(TINY), check=False)
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "Building DAG" not in text, text[-3000:]
    assert ("results/tiny/tokens/level1/train.npy is damaged (its sha256 record (.sha256 beside it) is gone, so its "
            "content cannot be checked); rebuild it and continue with `") in text, text[-3000:]
    # the printed command's first half, planned (in this process, conftest's `plan`)
    error, forced = plan(wd, configfiles=(TINY,), targets=["results/tiny/tokens/level1/train.npy"], force=True)
    assert error is None and "encode_split" in [rule for rule, _ in forced], (error, forced)


@pytest.mark.slow
def test_a_half_written_file_a_failed_job_left_is_cleaned_or_named_with_a_command_that_works(tiny_run, tmp_path):
    """A job that fills the disk leaves the files it had not declared (a member's copy of the tokenizer,
    half written); Snakemake deletes the declared ones. The next run plans that job again (it writes the
    folder anew) instead of stopping on the leftover as damaged. A finished model folder whose undeclared
    file is damaged is named with a command that rebuilds it: forcing the folder's weights (a
    `--force` of the file itself would name no rule)."""
    wd = tmp_path / "wf"
    shutil.copytree(tiny_run, wd, symlinks=True)
    member = wd / "results/tiny/models/small/d16_L1/s0/m1"
    (member / "tokenizer.json").write_text((member / "tokenizer.json").read_text()[:300])
    proc = run_snakemake(wd, "-n", "--cores", "1", "--configfile", str(TINY), check=False)
    text = proc.stdout + proc.stderr
    target = "results/tiny/models/small/d16_L1/s0/m1/model.safetensors"
    assert proc.returncode != 0 and f"--force {target} && " in text, text[-3000:]
    # the command planned (in this process, conftest's `plan`)
    error, forced = plan(wd, configfiles=(TINY,), targets=[target], force=True)
    assert error is None and "train_small" in [rule for rule, _ in forced], (error, forced)
    for name in ("model.safetensors", "config.json", "ledger.csv", "plan.json"):  # what Snakemake removes
        (member / name).unlink()
    error, jobs = plan(wd, configfiles=(TINY,))
    assert error is None and [rule for rule, _ in jobs].count("train_small") == 1, (error, jobs)


def test_rebuild_targets_are_declared_outputs():
    from growlm.hints import rebuild_target

    for path, target in [("results/models/small/d16_L1/s0/m1/tokenizer.json",
                          "results/models/small/d16_L1/s0/m1/model.safetensors"),
                         ("results/x/models/refined/msg/a/n2/t1/s0/growlm.json",
                          "results/x/models/refined/msg/a/n2/t1/s0/model.safetensors"),
                         ("results/models/baseline/d32_L2/t1/s0/ledger.csv", "results/models/baseline/d32_L2/t1/s0/ledger.csv"),
                         ("results/models/grown/msg/a/n2/s0/tokenizer.json", "results/models/grown/msg/a/n2/s0/growth.json"),
                         ("results/tokens/level1/train.npy", "results/tokens/level1/train.npy")]:
        assert rebuild_target(path) == target
