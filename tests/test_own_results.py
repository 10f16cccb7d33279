"""No silently reused training, one results folder per experiment, hints that rebuild the right thing.

- A training job resumes only a checkpoint of its own run: changing any input (the training or
  validation tokens, the tokenizer, the part of the data a member reads, the settings, the initial
  weights) makes it start over, saying which part changed; a finished job leaves no checkpoint.
- Every command growlm prints is the user's own command line, and running it rebuilds that
  experiment's file; a damaged input stops the run before any job, so nothing finished is deleted.
- Experiments write to their own folders; outputs that vanished are made again, never reported on.
- Legal but surprising values are warnings in the terminal; impossible ones named errors.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import SNAKEMAKE, TINY, job_counts, plan, run_snakemake
from growlm import hints, outputs
from growlm.errors import GrowlmError, damaged
from growlm.tokenizer import fit_tokenizer, load_tokenizer
from growlm.tokens import encode_file

TINY_RESULTS = "results/tiny"


# ---------------------------------------------------------------------------------------------
# the user's command, and the hints built from it
# ---------------------------------------------------------------------------------------------

def snakemake_options() -> dict:
    from snakemake.cli import get_argument_parser

    return hints.option_table(get_argument_parser())


@pytest.mark.parametrize("argv, args, targets", [
    ([".venv/bin/snakemake", "--cores", "2", "--configfile", "my.yaml"], ["--cores", "2", "--configfile", "my.yaml"],
     []),
    # targets, a dry run, a forced rule and a report request are the user's choice of what to run this time
    ([".venv/bin/snakemake", "results/x.csv", "-np", "--cores", "1", "--configfile", "a.yaml", "b.yaml", "--config",
      "experiment=x", "d0=[1,2]", "--forcerun", "compare", "--report", "r.html"],
     ["-p", "--cores", "1", "--configfile", "a.yaml", "b.yaml", "--config", "experiment=x", "d0=[1,2]"],
     ["results/x.csv"]),
    (["snakemake", "-c2", "--profile", "profiles/slurm", "--force", "all"], ["-c2", "--profile", "profiles/slurm"],
     ["all"]),
    # after `--` every word is a target (an option such as --configfile would take them otherwise)
    (["snakemake", "--cores", "1", "--configfile", "a.yaml", "--", "results/x.csv", "results/y.csv"],
     ["--cores", "1", "--configfile", "a.yaml"], ["results/x.csv", "results/y.csv"]),
])
def test_the_users_command_keeps_what_makes_the_experiment(argv, args, targets):
    command = hints.split_command(argv, snakemake_options())
    assert (command["args"], command["targets"]) == (args, targets)


def test_a_damaged_file_names_the_users_command(monkeypatch):
    argv = [".venv/bin/snakemake", "--cores", "2", "--configfile", "tests/config/tiny.yaml", "--config",
            "d1=[32,64]"]
    monkeypatch.setenv(hints.COMMAND_ENV, json.dumps(hints.split_command(argv, snakemake_options())))
    message = str(damaged("results/tiny/tokens/level1/train.npy", "truncated"))
    own = ".venv/bin/snakemake --cores 2 --configfile tests/config/tiny.yaml --config 'd1=[32,64]'"
    assert message.endswith(f"`{own} --force results/tiny/tokens/level1/train.npy && {own}`"), message
    # a file inside a grown model's folder is rebuilt through the folder's declared output
    grown = "results/tiny/models/grown/msg/d16_L1_to_d32_L2/n2/s0/growlm_grown.safetensors"
    assert f"--force {Path(grown).parent}/growth.json &&" in str(damaged(grown, "x"))


def test_outputs_finds_damaged_files_and_remembers_whole_ones(tmp_path):
    from growlm.errors import record_sha256

    token_file = tmp_path / "results" / "tokens" / "level0" / "train.npy"
    token_file.parent.mkdir(parents=True)
    np.save(token_file, np.arange(100, dtype=np.uint16))
    record_sha256(token_file)
    (tmp_path / "results" / "tokenizer").mkdir()
    (tmp_path / "results" / "tokenizer" / "tokenizer.json").write_text('{"model": ')
    folder = tmp_path / "results"
    found = outputs.damaged_files(folder)
    assert found == [(str(folder / "tokenizer" / "tokenizer.json"), found[0][1])] and "not valid JSON" in found[0][1]
    cache = json.loads((folder / outputs.CACHE).read_text())
    assert str(token_file) in cache  # hashed once, then known by size and modification time
    data = bytearray(token_file.read_bytes())
    data[-3] ^= 0xFF
    token_file.write_bytes(bytes(data))
    assert str(token_file) in [p for p, _ in outputs.damaged_files(folder)]


# ---------------------------------------------------------------------------------------------
# checkpoints belong to their run
# ---------------------------------------------------------------------------------------------

class _Stop(Exception):
    pass


def _corpus(root: Path, text: str, *, vocab_size: int = 300) -> dict:
    root.mkdir(parents=True, exist_ok=True)
    (root / "train.txt").write_text(text)
    (root / "val.txt").write_text("the hen said who will help me\nthe cat ran to the red barn\n" * 40)
    fit_tokenizer([root / "train.txt"], root / "tok", vocab_size=vocab_size)
    tok = load_tokenizer(root / "tok")
    encode_file(root / "train.txt", tok, root / "train.npy")
    encode_file(root / "val.txt", tok, root / "val.npy")
    return {"train_file": root / "train.npy", "val_file": root / "val.npy", "tokenizer_dir": root / "tok"}


TEXT = "\n".join(["the little red hen found a grain of wheat", "who will help me plant it said the hen",
                  "not i said the duck", "not i said the cat and the dog ran off"] * 120) + "\n"
TRAIN = {"tokens": 8 * 16 * 40, "batch_size": 8, "context": 16, "lr": 3e-3, "warmup_steps": 4, "eval_interval": 10,
         "eval_tokens": 512, "checkpoint_every": 5, "seed": 1}
MODEL = {"n_embd": 16, "n_layer": 1, "n_positions": 16, "head_dim": 8, "tie_word_embeddings": True}


def _interrupted(tmp_path: Path, data: dict, *, train=TRAIN, init_seed=3, shard=None) -> Path:
    """A member job's run stopped after its checkpoint of step 10, exactly as the job would have made
    it (same settings, model, memory plan and inputs), as a killed job leaves it."""
    from growlm.devices import choose_device
    from growlm.checkpoint import checkpoint_dir_for
    from growlm.model import build_model
    from growlm.runner import TrainingJob, identify_inputs, job_plan
    from growlm.memory.estimate import apply_plan
    from growlm.shape import ModelShape
    from growlm.tokenizer import vocab_size
    from growlm.tokens import load_tokens, shard as take_shard
    from growlm.train import train as train_loop
    from growlm.train_config import TrainConfig

    out = tmp_path / "results" / "models" / "small" / "m1"
    cfg = TrainConfig.from_dict(train, device=choose_device())
    model = build_model(seed=init_seed, vocab_size=vocab_size(data["tokenizer_dir"]), **MODEL)
    ckpt = checkpoint_dir_for(out)
    plan, _ = job_plan(ModelShape.of(model), cfg, ckpt, log=lambda *_: None)
    cfg.inputs = identify_inputs(TrainingJob(cfg, out_dir=out, shard=shard, **data))
    train_tokens = load_tokens(data["train_file"])
    if shard is not None:
        train_tokens = take_shard(train_tokens, *shard)

    def stop(done):
        if done == 10:
            raise _Stop

    with pytest.raises(_Stop):
        train_loop(model, train_tokens, load_tokens(data["val_file"]), apply_plan(cfg, plan), ckpt_dir=ckpt,
                   ledger_path=ckpt / "ledger.csv", log=lambda *_: None, step_callback=stop)
    assert (ckpt / "step_00000010").is_dir()
    return out


def _job(out: Path, data: dict, *, train=TRAIN, init_seed=3, shard=None) -> dict:
    from growlm.jobs.train import train_model

    return train_model(train=train, model=MODEL, init_seed=init_seed, role="small member m1", out_dir=out,
                       shard=shard, **data)


def _final_loss(out: Path) -> float:
    return json.loads((out / "growlm.json").read_text())["train"]["final_val_loss"]


def _other_validation_text(data: dict, root: Path) -> dict:
    (root / "val.txt").write_text("a goose and a duck swam in the pond\n" * 40)
    encode_file(root / "val.txt", load_tokenizer(data["tokenizer_dir"]), data["val_file"])
    return data


CHANGES = {  # each writes the changed input where the job reads it
    "training tokens": lambda data, root: _corpus(root, TEXT.replace("hen", "goose")),
    "validation tokens": _other_validation_text,
    "tokenizer": lambda data, root: _corpus(root, TEXT, vocab_size=280),
}


@pytest.mark.parametrize("change", ["nothing", "training tokens", "validation tokens", "tokenizer",
                                    "part of the training tokens", "settings", "initial weights"])
def test_a_training_job_resumes_only_a_checkpoint_of_its_own_run(tmp_path, capsys, change):
    """A member job killed at step 10 of 40, then run again with one input changed: it starts over and
    says which part of its run changed (with nothing changed it resumes), and it ends exactly where a
    run from scratch with the new input ends. A finished job leaves no checkpoint behind."""
    data = _corpus(tmp_path / "data", TEXT)
    shard = [0, 2] if change == "part of the training tokens" else None
    out = _interrupted(tmp_path, data, shard=shard)
    train, init_seed = dict(TRAIN), 3
    if change in CHANGES:
        data = CHANGES[change](data, tmp_path / "data")
    elif change == "part of the training tokens":
        shard = [1, 2]
    elif change == "settings":
        train["lr"] = 1e-3
    elif change == "initial weights":
        init_seed = 4
    capsys.readouterr()
    _job(out, data, train=train, init_seed=init_seed, shard=shard)
    log = capsys.readouterr().out
    if change == "nothing":
        assert "resumed from checkpoint step_00000010" in log, log
        assert "not resuming" not in log
    else:
        line = next((x for x in log.splitlines() if "not resuming from the checkpoints" in x), None)
        assert line is not None and change in line.partition("(other ")[2], log
        assert "resumed from checkpoint" not in log
        fresh = tmp_path / "fresh" / "results" / "models" / "small" / "m1"
        _job(fresh, data, train=train, init_seed=init_seed, shard=shard)
        assert _final_loss(out) == _final_loss(fresh)
    rows = (out / "ledger.csv").read_text().splitlines()
    assert rows[1].startswith("0,0,0,")  # the ledger begins at step 0 of this run
    assert not (tmp_path / "results" / "checkpoints").exists()  # removed once the model was saved


# ---------------------------------------------------------------------------------------------
# the workflow: damaged and vanished files, two experiments, printed hints run as printed
# ---------------------------------------------------------------------------------------------

def _flip(path: Path, at: int = -100) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))


def _hint(text: str) -> list[list[str]]:
    """The commands of the one line in backticks after "continue with", as argument lists."""
    line = text.split("continue with `", 1)[1].split("`", 1)[0]
    return [shlex.split(part) for part in line.split(" && ")]


def _run_printed(wd: Path, words: list[str]) -> subprocess.CompletedProcess:
    assert words[:3] == [sys.executable, "-m", "snakemake"], words  # the tests start Snakemake so
    return run_snakemake(wd, *words[3:])


@pytest.fixture
def tiny_copy(tiny_run, tmp_path) -> Path:
    wd = tmp_path / "wf"
    shutil.copytree(tiny_run, wd, symlinks=True)
    return wd


@pytest.mark.slow
def test_a_damaged_input_stops_the_run_before_any_job_and_its_hint_rebuilds_it(tiny_copy):
    """A token file altered after a finished run: the run stops before any job (the finished M_0 that
    reads it is still there), naming the file and one line that is the user's own command; run as
    printed, it rebuilds the tiny experiment's file, never a file of another experiment, and the
    run then finishes."""
    wd = tiny_copy
    token_file = wd / TINY_RESULTS / "tokens" / "level1" / "train.npy"
    m0 = wd / TINY_RESULTS / "models" / "baseline" / "d32_L2" / "t24000_lr0.003" / "s0" / "model.safetensors"
    _flip(token_file)
    proc = run_snakemake(wd, "--cores", "2", "--configfile", str(TINY), check=False)
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "results/tiny/tokens/level1/train.npy is damaged" in text, text[-3000:]
    assert m0.is_file()  # nothing was deleted
    rebuild, again = _hint(text)
    assert rebuild[-2:] == ["--force", "results/tiny/tokens/level1/train.npy"] and str(TINY) in rebuild
    _run_printed(wd, rebuild)
    _run_printed(wd, again)
    assert outputs.damaged_files(wd / TINY_RESULTS) == []
    assert sorted(p.name for p in (wd / "results").iterdir()) == ["tiny"]  # no default experiment made
    assert plan(wd, configfiles=(TINY,)) == (None, [])  # nothing left to do (planned in this process)


@pytest.mark.slow
def test_the_hints_of_a_run_with_targets_after_dashes_put_their_flags_before_them(tiny_copy):
    """A run started with `-- targets` (after an option that takes several values): the damaged-file hint puts
    its --force before the `--` and the interrupted-run notice its --unlock, and both run as printed (after the
    `--` either would be a target: "No rule to produce --force")."""
    wd, target = tiny_copy, f"{TINY_RESULTS}/eval/comparison.csv"
    member = wd / TINY_RESULTS / "models/small/d16_L1/s0/m2/model.safetensors"
    _flip(member, -7)
    proc = run_snakemake(wd, "-n", "--cores", "1", "--configfile", str(TINY), "--", target, check=False)
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "m2/model.safetensors is damaged" in text, text[-3000:]
    rebuild, again = _hint(text)
    assert rebuild[-3:] == ["--force", "--", str(member.relative_to(wd))] and again[-2:] == ["--", target]
    planned = _run_printed(wd, [*rebuild[:3], "-n", "--quiet", "rules", *rebuild[3:]])
    assert job_counts(planned.stdout).get("train_small") == 1
    _flip(member, -7)  # whole again: the notice of a run killed before this one
    (wd / ".snakemake" / "locks").mkdir(parents=True, exist_ok=True)
    (wd / ".snakemake" / "locks" / "0.input.lock").write_text("")
    proc = run_snakemake(wd, "--cores", "1", "--configfile", str(TINY), "--", target, check=False)  # stops: locked
    command = proc.stderr.split("this command continues the run:\n", 1)[1].splitlines()[0].strip()
    unlock, again = (shlex.split(part) for part in command.split(" && "))
    assert unlock[-3:] == ["--unlock", "--", target], unlock
    _run_printed(wd, unlock)
    assert not list((wd / ".snakemake" / "locks").glob("*.lock"))
    done = _run_printed(wd, again)
    assert "Nothing to be done" in done.stdout + done.stderr


@pytest.mark.slow
def test_the_hints_for_a_model_and_a_grown_model_rebuild_them(tiny_copy):
    wd = tiny_copy
    member = wd / TINY_RESULTS / "models/small/d16_L1/s0/m2/model.safetensors"
    grown = wd / TINY_RESULTS / "models/grown/concat+zero_block/d16_L1_to_d32_L2/n2/s0/growlm_grown.safetensors"
    _flip(member, -7)
    _flip(grown, -7)
    proc = run_snakemake(wd, "-n", "--cores", "1", "--configfile", str(TINY), check=False)
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "m2/model.safetensors is damaged" in text and "growlm_grown.safetensors is " \
        "damaged" in text, text[-3000:]
    rebuild, again = _hint(text)
    assert rebuild[-3] == "--force"
    assert set(rebuild[-2:]) == {str(member.relative_to(wd)), str(grown.parent.relative_to(wd) / "growth.json")}
    _run_printed(wd, rebuild)
    assert outputs.damaged_files(wd / TINY_RESULTS) == []
    proc = _run_printed(wd, [*again, "-n", "--quiet", "rules"])
    assert job_counts(proc.stdout)["refine"] >= 1  # what was grown from them is made again


@pytest.mark.slow
def test_vanished_models_are_made_again_and_never_reported_on(tiny_copy, capsys):
    """The plan (in this process, conftest's `plan`: what the Snakefile prints is captured) makes the vanished
    member again and says so; the report (a real run) refuses."""
    wd = tiny_copy
    (wd / TINY_RESULTS / "models/small/d16_L1/s0/m1/model.safetensors").unlink()
    capsys.readouterr()
    error, jobs = plan(wd, configfiles=(TINY,))
    assert error is None and [rule for rule, _ in jobs].count("train_small") == 1, (error, jobs)
    assert "are gone (results/tiny/models/small/d16_L1/s0/m1/model.safetensors)" in capsys.readouterr().err
    proc = run_snakemake(wd, "--cores", "1", "--configfile", str(TINY), "--report", "results/tiny/report2.html",
                         check=False)
    assert proc.returncode != 0 and "the report would describe models that no longer exist" in proc.stderr
    assert not (wd / TINY_RESULTS / "report2.html").exists()


@pytest.mark.slow
def test_two_experiments_in_one_folder_keep_both_reports(tiny_run, tiny2_run, capsys):
    """A second experiment (another name, other settings: tiny2 of tests/conftest.py) run beside the tiny one,
    in a copy of its finished folder: both reports and comparisons stay; the tiny one's files are not touched
    (their dates are those of the finished tiny run the copy kept). Changing the settings under the same name
    says that it rebuilds that experiment in place (planned in this process, conftest's `plan`: what the
    Snakefile prints is captured)."""
    wd = tiny2_run
    capsys.readouterr()
    error, _ = plan(wd, "corpus={val_fraction: 0.1}", configfiles=(TINY,))
    said = capsys.readouterr().err
    assert error is None, error
    assert "holds the experiment 'tiny' made with other settings (corpus.val_fraction" in said, said[-3000:]
    assert "--config experiment=NAME" in said
    assert (wd / "results/tiny2/report.html").stat().st_size > 100_000
    assert (wd / TINY_RESULTS / "report.html").stat().st_size > 100_000
    before, after = ({p.relative_to(run): p.stat().st_mtime_ns for p in (run / TINY_RESULTS).rglob("*") if p.is_file()}
                     for run in (tiny_run, wd))
    changed = [str(p) for p in before if after.get(p) != before[p] and ".growlm" not in str(p)]
    assert not changed, changed
    assert (wd / "results/tiny2/eval/comparison.csv").read_text() != (wd / TINY_RESULTS / "eval/comparison.csv") \
        .read_text()


@pytest.mark.slow
def test_a_finished_run_leaves_no_checkpoint(tiny_run):
    assert not (tiny_run / TINY_RESULTS / "checkpoints").exists()
    assert json.loads((tiny_run / TINY_RESULTS / outputs.RECORD).read_text())["experiment"] == "tiny"


# ---------------------------------------------------------------------------------------------
# the smaller gaps: named before any job, or a warning in the terminal
# ---------------------------------------------------------------------------------------------

def test_impossible_values_are_named_before_any_job(workflow_dir):
    """Named while the Snakefile is parsed (in this process, conftest's `plan`; what the terminal shows of a
    config error: tests/test_workflow.py's test_a_bad_config_is_one_message_in_the_terminal)."""
    text, _ = plan(workflow_dir, "d1=[32,32]", "seeds=[]", configfiles=(TINY,))
    assert text is not None and text.startswith("config error: "), text
    assert "d1 = [32, 32]: 32 appears more than once" in text and "seeds = []: an empty list" in text, text[-3000:]
    (workflow_dir / "bad.yaml").write_text(
        "members: {data: shards, shards: 100000}\n"
        "corpus:\n  sources:\n"
        "    - {name: a, level: 0, bundled: pg14642_mcguffey_eclectic_primer.txt}\n"
        "    - {name: '..', level: 1, bundled: pg18735_little_red_hen.txt}\n"
        "    - {name: c, level: 1, url: 'https://example.org/book.txt'}\n"
        "    - {name: d, level: 1, url: 'file:///etc/passwd', sha256: null}\n")
    text, _ = plan(workflow_dir, configfiles=(TINY, "bad.yaml"))
    assert text is not None
    for expected in ["corpus.sources[1] (..): a source's name is its folder",
                     "corpus.sources[2] (c): url 'https://example.org/book.txt' without sha256",
                     "corpus.sources[3] (d): url 'file:///etc/passwd' without sha256",
                     "members.shards = 100000: each member would read at most"]:
        assert expected in text, (expected, text[-4000:])
    text, _ = plan(workflow_dir, "experiment=models", configfiles=(TINY,))
    assert text is not None and "experiment = 'models': the default experiment keeps its models/ folder" in text, text


def test_surprising_values_are_warnings_in_the_terminal(workflow_dir):
    (workflow_dir / "odd.yaml").write_text(
        "members: {data: shards, shards: 50}\n"
        "corpus:\n  sources:\n"
        "    - {name: a, level: 0, bundled: pg14642_mcguffey_eclectic_primer.txt}\n"
        "    - {name: b, level: 1, bundled: pg18735_little_red_hen.txt}\n"
        "    - {name: c, level: 1, url: 'https://example.org/book.txt', sha256: skip}\n")
    proc = run_snakemake(workflow_dir, "-n", "--cores", "1", "--configfile", str(TINY), "odd.yaml")
    assert "growlm: warning: corpus.sources[2] (c): sha256: skip - https://example.org/book.txt is taken without " \
           "a check" in proc.stderr
    assert "growlm: warning: members.shards = 50: each member's shard holds about" in proc.stderr
    # the GPU overlay on a machine without a GPU says what it would cost
    proc = run_snakemake(workflow_dir, "-n", "--quiet", "rules", "--cores", "1", "--configfile", "config/config.yaml",
                         "config/gpu.yaml")
    if not Path("/dev/nvidia0").exists():
        assert "this machine has no GPU: about" in proc.stderr and "roneneldan/TinyStories" in proc.stderr


def test_a_hub_dataset_that_cannot_be_read_stops_the_run_before_any_job(workflow_dir):
    (workflow_dir / "hub.yaml").write_text(
        "corpus:\n  sources:\n"
        "    - {name: a, level: 0, bundled: pg14642_mcguffey_eclectic_primer.txt}\n"
        "    - {name: stories, level: 1, hf: no-such-owner/no-such-dataset}\n")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "SLURM_CONF": "/dev/null"}
    proc = subprocess.run([*SNAKEMAKE, "--cores", "1", "--configfile", str(TINY), "hub.yaml"], cwd=workflow_dir,
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode != 0
    assert "corpus.sources[1] (stories): hf 'no-such-owner/no-such-dataset': HF_HUB_OFFLINE is set" in proc.stderr
    assert not (workflow_dir / TINY_RESULTS).exists()  # no job ran


@pytest.mark.slow
def test_a_vocabulary_the_corpus_cannot_fill_is_a_warning_in_the_terminal(tiny_copy):
    proc = run_snakemake(tiny_copy, f"{TINY_RESULTS}/tokenizer/tokenizer.json", "--cores", "1", "--configfile",
                         str(TINY), "--config", "tokenizer={vocab_size: 300000}", "experiment=tiny")
    assert "growlm: warning: tokenizer.vocab_size = 300000: the corpus gives only" in proc.stderr, proc.stderr[-2000:]


def test_a_members_shard_shorter_than_a_window_names_the_setting(tmp_path):
    from growlm.runner import TrainingJob, job_tokens
    from growlm.train_config import TrainConfig

    np.save(tmp_path / "train.npy", np.zeros(13 * 1000, dtype=np.uint16))  # shards of 13 tokens
    job = TrainingJob(TrainConfig(tokens=1000, batch_size=16, context=32, lr=1e-3, warmup_steps=50), out_dir=tmp_path / "m", train_file=tmp_path / "train.npy",
                      val_file=tmp_path / "train.npy", shard=[3, 1000])
    with pytest.raises(GrowlmError, match=r"members.shards = 1000: this member's shard holds 13 tokens"):
        job_tokens(job)

