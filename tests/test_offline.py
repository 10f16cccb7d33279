"""Runs without a network, as on cluster compute nodes (growlm.hub, the `prepare` target).

The network is cut for every run here: the Hub's endpoint is a closed port on this machine
(`HF_ENDPOINT=http://127.0.0.1:9`, refused at once), and the Hub's cache (`HF_HOME`) is the test's own.
A Hub member that is not in the cache stops the dry run at once, with the whole message naming it
and the command that prepares it, with `HF_HUB_OFFLINE` set and without. The Hub members a login
node's `prepare` left in the cache (laid out as huggingface_hub lays out what it downloads) are then
used by the tiny experiment with no network at all: `prepare` imports them and loads the benchmark
task's documents, and each job of the run that reads what it left then runs offline, never waiting
on the Hub.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM, GPT2LMHeadModel

from conftest import SNAKEMAKE, TINY
from test_pretrained import FAST, members

CUT = {"HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_DISABLE_TELEMETRY": "1"}  # port 9: nothing listens


def snakemake(wd: Path, *args: str, env: dict, timeout: int = 900) -> tuple[subprocess.CompletedProcess, float]:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE"))}
    full.update(env)
    t0 = time.perf_counter()
    proc = subprocess.run([*SNAKEMAKE, *args], cwd=wd, env=full, capture_output=True, text=True, timeout=timeout)
    return proc, time.perf_counter() - t0


def into_hub_cache(hf_home: Path, repo: str, folder: str) -> None:
    """`folder`'s files as huggingface_hub's cache holds a downloaded model repository: a snapshot folder
    named by its commit, and refs/main naming that commit (what `prepare` leaves on a login node)."""
    root = hf_home / "hub" / f"models--{repo.replace('/', '--')}"
    commit = hashlib.sha1(repo.encode()).hexdigest()
    snap = root / "snapshots" / commit
    snap.mkdir(parents=True)
    for f in Path(folder).iterdir():
        if f.is_file():
            shutil.copy(f, snap / f.name)
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text(commit)


@pytest.mark.parametrize("offline_variable", [False, True], ids=["network-cut", "HF_HUB_OFFLINE"])
def test_a_hub_member_without_network_fails_at_once_naming_it(workflow_dir, tmp_path, offline_variable):
    (workflow_dir / "hub.yaml").write_text("members: {pretrained: [someone/tiny-member-a, someone/tiny-member-b]}\n")
    env = {**CUT, "HF_HOME": str(tmp_path / "hf"), **({"HF_HUB_OFFLINE": "1"} if offline_variable else {})}
    proc, took = snakemake(workflow_dir, "-n", "--cores", "1", "--configfile", str(TINY), "hub.yaml", env=env)
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert "the Hub member 'someone/tiny-member-a' cannot be read" in out
    assert ("HF_HUB_OFFLINE is set" if offline_variable else "cannot be reached (ConnectError") in out
    # the whole line, not cut: the command that prepares it and the alternative
    assert "fetch it where there is a network with `snakemake --cores all prepare`" in out
    assert "or give a local folder instead of the id" in out
    assert "Retrying" not in out
    assert took < 60, f"the dry run took {took:.1f} s to refuse"  # (Snakemake's own start, under a loaded CI)
    # the check itself, at once: what the dry run asks of each Hub member, in a fresh process
    probe = ("import time; t = time.perf_counter()\nfrom growlm.errors import GrowlmError\n"
             "from growlm.pretrained import read_member\ntry:\n    read_member('someone/tiny-member-a', 1, context=32)\n"
             "except GrowlmError as err:\n    print(round(time.perf_counter() - t, 3), err)\n")
    full = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE"))}
    proc = subprocess.run([sys.executable, "-c", probe], env={**full, **env}, capture_output=True, text=True,
                          timeout=120)
    seconds, _, message = proc.stdout.strip().partition(" ")
    assert "the Hub member 'someone/tiny-member-a' cannot be read" in message, proc.stdout + proc.stderr
    assert float(seconds) < 5.0, f"refused after {seconds} s"


@pytest.mark.slow
def test_prepare_then_run_offline(tiny_run, tmp_path):
    """Two Hub members in the cache, a benchmark task of documents in a folder: `prepare` (network cut)
    imports the members and loads the task's documents, trains nothing; the experiment's jobs then run with
    HF_HUB_OFFLINE set, and no job waited on the Hub.

    In a copy of the shared tiny run that keeps only its corpus (bundled books: no job of it reads the Hub),
    the offline run makes one job of each rule from the imported members on (what `prepare` left): the
    tokenizer from member 1, the token files, M_0 (built like member 1), the growth of the members and its
    refinement, and the refined model's held-out metrics and benchmark task through lm-evaluation-harness
    (which reads the task's documents from the Hub's cache). Not the same jobs again for the other models,
    nor the comparison and the report, which read only these jobs' files (the comparison of pretrained
    members: tests/test_pretrained.py)."""
    wd = tmp_path / "wf"
    shutil.copytree(tiny_run, wd, symlinks=True)
    for made in ("tokenizer", "tokens", "models", "checkpoints", "eval", "report", "profile", "live", "logs",
                 "benchmarks"):
        shutil.rmtree(wd / "results" / "tiny" / made, ignore_errors=True)
    hf = tmp_path / "hf"
    mine = members(tmp_path / "mine", "gpt2")
    for i, folder in enumerate(mine):
        into_hub_cache(hf, f"someone/tiny-member-{'ab'[i]}", folder)
    task = wd / "my_task"
    task.mkdir()
    (task / "docs.jsonl").write_text("".join(json.dumps({"context": "the little red hen said", "target": w}) + "\n"
                                             for w in ("yes", "no", "who", "I")))
    (task / "hen.yaml").write_text(
        "task: hen_words\ndataset_path: json\ndataset_kwargs: {data_files: {test: " + str(task / "docs.jsonl") + "}}\n"
        "output_type: loglikelihood\ntest_split: test\ndoc_to_text: '{{context}}'\ndoc_to_target: '{{target}}'\n"
        "metric_list: [{metric: acc, aggregation: mean, higher_is_better: true}]\n")
    (wd / "hub.yaml").write_text(  # the tiny experiment's own name: its corpus is the shared run's
        "methods: [msg]\nmembers: {pretrained: [someone/tiny-member-a, someone/tiny-member-b]}\n"
        "evaluate: {tasks: [my_task/], task_limit: 4}\n" + FAST)
    args = ["--cores", "2", "--configfile", str(TINY), "hub.yaml"]
    env = {**CUT, "HF_HOME": str(hf)}

    proc, _ = snakemake(wd, "prepare", *args, env=env)  # (a target after --configfile would be read as a file)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "every job reads the Hub's local cache" in out  # said once, and the jobs were told
    assert out.count("rule import_member") == 2 and "rule fetch_task_data" in out
    assert "rule train_" not in out and "rule refine" not in out
    record = json.loads((wd / "results/tiny/tasks/data/my_task.json").read_text())
    assert record["tasks"] == {"hen_words": {"test": 4}}

    refined = "results/tiny/eval/refined/msg/d16_L1_to_d32_L2/n2/t24000_lr0.003/s0"
    targets = [f"{refined}/metrics.json", f"{refined}/tasks/my_task.json",
               "results/tiny/models/baseline/d32_L2/t24000_lr0.003/s0/model.safetensors"]
    proc, _ = snakemake(wd, *targets, *args, env={**env, "HF_HUB_OFFLINE": "1"})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "rule import_member" not in out  # prepared: nothing of the Hub is read again
    assert "rule evaluate_tasks" in out and "rule member_tokenizer" in out  # the jobs that read the Hub's cache ran
    for job in ("checkpoint encode_split", "rule train_baseline", "rule grow", "rule refine", "rule evaluate_model"):
        assert job in out, job
    assert all((wd / target).is_file() for target in targets)
    # GPT-2 members make GPT-2 models of their vocabulary, on their own tokenizer, and no member is trained
    # (Llama members': tests/test_pretrained.py)
    member_vocab = json.loads(Path(mine[0], "config.json").read_text())["vocab_size"]
    for model in ("baseline/d32_L2/t24000_lr0.003/s0", "refined/msg/d16_L1_to_d32_L2/n2/t24000_lr0.003/s0"):
        loaded = AutoModelForCausalLM.from_pretrained(wd / "results/tiny/models" / model)
        assert type(loaded) is GPT2LMHeadModel and loaded.config.vocab_size == member_vocab, model
    tokenizer = json.loads((wd / "results/tiny/tokenizer/tokenizer.json").read_text())
    assert tokenizer == json.loads(Path(mine[0], "tokenizer.json").read_text())
    assert not (wd / "results/tiny/models/small").exists()
    logs = "".join(p.read_text() for p in (wd / "results/tiny/logs").rglob("*.log"))
    assert "Retrying" not in logs and "huggingface.co" not in logs


@pytest.mark.slow
def test_a_hub_member_whose_revision_changes_remakes_the_tokenizer_in_the_same_run(workflow_dir, tmp_path):
    """Hub members whose revision is changed to a commit with another tokenizer: the run that imports them
    again remakes the experiment's tokenizer (what reads member 1's files is known by the commit its
    revision resolves to), not only the imports. The Hub's cache holds both commits; no network."""
    wd, hf = workflow_dir, tmp_path / "hf"
    old = members(tmp_path / "old", "gpt2")
    new = members(tmp_path / "new", "gpt2", vocab_book="pg14642_mcguffey_eclectic_primer.txt", vocab=350)
    for i, repo in enumerate(("someone/member-a", "someone/member-b")):
        for label, folders in (("old", old), ("new", new)):
            snap = hf / "hub" / f"models--{repo.replace('/', '--')}" / "snapshots" / hashlib.sha1(label.encode()).hexdigest()
            shutil.copytree(folders[i], snap)

    def configure(label: str) -> None:
        commit = hashlib.sha1(label.encode()).hexdigest()
        items = [{"hf": repo, "revision": commit} for repo in ("someone/member-a", "someone/member-b")]
        (wd / "hub.yaml").write_text(f"experiment: hub\nmethods: [msg]\nmembers: {{pretrained: {json.dumps(items)}}}\n"
                                     + FAST)

    target = "results/hub/tokenizer/tokenizer.json"
    args = [target, "--cores", "1", "--configfile", str(TINY), "hub.yaml"]
    env = {**CUT, "HF_HOME": str(hf), "HF_HUB_OFFLINE": "1"}
    configure("old")
    proc, _ = snakemake(wd, *args, env=env)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert json.loads((wd / target).read_text()) == json.loads((Path(old[0]) / "tokenizer.json").read_text())
    configure("new")
    proc, _ = snakemake(wd, *args, env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "rule member_tokenizer" in out, out[-3000:]
    assert json.loads((wd / target).read_text()) == json.loads((Path(new[0]) / "tokenizer.json").read_text())
