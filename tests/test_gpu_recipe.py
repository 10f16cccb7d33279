"""The GPU recipe, checked without a GPU: `config/gpu.yaml` builds its DAG offline and runs end to end on
the CPU at a reduced size; GPU jobs never run more at once than the GPU profile allows; the memory
planner budgets the share of the GPU a job was given; `train.compile` and the share reach the jobs
without being part of what reruns them; refinement runs under torchrun like the other training jobs;
`setup.sh` picks the torch build from the NVIDIA driver.

Jobs that ask for a GPU on a machine without one train on the CPU (`growlm.devices.choose_device`;
`growlm.launch.processes_for` launches torchrun only when the GPUs asked for are visible), so the
scheduling tests run real jobs here. Which GPU figures are still to be measured is said in
docs/gpu-and-clusters.md ("On a GPU")."""

from __future__ import annotations

import csv
import itertools
import json
import os
import shutil
import subprocess
import types
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from conftest import REPO, TINY, check_profile_tables, copy_workflow, job_counts, run_snakemake
from growlm.errors import GrowlmError
from growlm.flops import train_flops_per_token
from growlm.memory import estimate as P
from growlm.memory.measure import make_plan
from growlm.shape import ModelShape
from growlm.train_config import TrainConfig

GPU = REPO / "config" / "gpu.yaml"
GPU_RULES = {"train_small", "train_trunk", "train_baseline", "refine", "profile", "evaluate_model",
             "evaluate_ensemble"}  # the rules that declare a `gpu` resource
GiB = 2**30


def merged_gpu_config() -> dict:
    """config.yaml with gpu.yaml over it, merged as Snakemake merges config files (mappings key by
    key, everything else replaced)."""
    def merge(base, over):
        if isinstance(base, dict) and isinstance(over, dict):
            return {**base, **{k: merge(base.get(k), v) for k, v in over.items()}}
        return over

    return merge(yaml.safe_load((REPO / "config" / "config.yaml").read_text()), yaml.safe_load(GPU.read_text()))


# ---------------------------------------------------------------------------------------------
# config/gpu.yaml: what it says it is, a dry run offline, a smoke run on the CPU
# ---------------------------------------------------------------------------------------------

def test_the_gpu_overlay_is_what_its_comments_say():
    """GPT-2-small-scale shapes for the tensor cores, and the time estimate in its comments
    recomputed from growlm.flops (so that the estimate cannot drift from the settings)."""
    c = merged_gpu_config()
    assert (c["d0"], c["L0"], c["d1"], c["L1"], c["n"]) == ([384], [6], [768], [12], [2])
    assert c["methods"] == ["msg", ["concat", "zero_block"]]
    assert c["model"]["head_dim"] == 64 and c["model"]["context"] in (512, 1024)
    assert c["tokenizer"]["vocab_size"] % 64 == 0 and c["tokenizer"]["vocab_size"] <= 65536  # uint16 tokens
    assert c["train"]["compile"] is True and c["resources"]["gpu"] == 1
    T, V = c["model"]["context"], c["tokenizer"]["vocab_size"]
    member = train_flops_per_token(n_embd=384, n_layer=6, vocab_size=V, context=T)
    large = train_flops_per_token(n_embd=768, n_layer=12, vocab_size=V, context=T)
    small, big = c["train"]["small"], c["train"]["large"]
    total = 2 * member * small["tokens"] + 4 * large * big["tokens"]  # M_0, msg, concat, concat's control
    text = GPU.read_text()
    assert f"{member / 1e6:.1f} MFLOP/token" in text and f"{large / 1e6:.0f} MFLOP/token" in text
    assert f"total {total:.1e} FLOPs" in text
    minutes = {mfu: total / (mfu * 989e12) / 60 for mfu in (0.35, 0.40, 0.45, 0.339)}  # 0.339: RESULTS 4, d 768
    assert f"{minutes[0.45]:.0f}-{minutes[0.35]:.0f} minutes" in text, minutes
    assert f"({minutes[0.40]:.0f} at 40 %)" in text and f"{minutes[0.339]:.0f} minutes" in text
    for stage in (small, big):
        steps = TrainConfig(tokens=stage["tokens"], batch_size=stage["batch_size"], context=T, lr=stage["lr"],
                            warmup_steps=stage["warmup_steps"]).steps
        assert f"{steps:,} steps" in text


def test_the_gpu_overlay_dry_runs_offline(workflow_dir):
    """The documented command (docs/gpu-and-clusters.md), as a dry run: the Hub source needs no network until its job runs."""
    proc = run_snakemake(workflow_dir, "-n", "--quiet", "rules", "--profile", "profiles/gpu", "--configfile",
                         "config/config.yaml", "config/gpu.yaml")
    counts = job_counts(proc.stdout)
    assert counts["train_small"] == 2 and counts["train_baseline"] == 1
    assert counts["grow"] == counts["refine"] == 2  # msg and concat + zero_block (no m_1-only control)
    assert counts["profile"] == 6 and counts["prepare_source"] == 20  # TinyStories and the 19 readers


def hub_stories(root: Path, count: int) -> Path:
    """A stand-in for roneneldan/TinyStories: short stories from a bundled book, in the Hub's layout, so
    that the overlay's `hf:` source loads through the very call a Hub id takes."""
    from test_sources import hub_folder, stories

    return hub_folder(root, stories("pg18735_little_red_hen.txt", count),
                      stories("pg18735_little_red_hen.txt", 20, start=count))


def job_intervals(results: Path) -> list[tuple[str, float, float]]:
    """(job, start, end) of every GPU job of a run, from its benchmark: Snakemake writes a job's
    benchmark TSV when the job ends (its modification time) with the job's wall seconds (`s`)."""
    out = []
    for rule in GPU_RULES:
        for tsv in (results / "benchmarks" / rule).rglob("*.tsv"):
            rows = list(csv.DictReader(tsv.open(), delimiter="\t"))
            end = tsv.stat().st_mtime
            out.append((str(tsv.relative_to(results / "benchmarks")), end - float(rows[-1]["s"]), end))
    return out


def overlaps(intervals, slack: float = 0.05) -> list[tuple[str, str]]:
    """Pairs of jobs that ran at the same time (by more than `slack` seconds)."""
    return [(a, b) for (a, s1, e1), (b, s2, e2) in itertools.combinations(intervals, 2)
            if min(e1, e2) - max(s1, s2) > slack]


def most_at_once(intervals, slack: float = 0.05) -> int:
    """The largest number of jobs running at one moment (each job's start moved `slack` seconds
    later, so that one that starts as another ends is not counted twice)."""
    kept = [(s + slack, e) for _, s, e in intervals if e > s + slack]
    events = sorted([(s, 1) for s, _ in kept] + [(e, -1) for _, e in kept])
    running = most = 0
    for _, step in events:  # at equal times the ends (-1) come first
        running += step
        most = max(most, running)
    return most


@pytest.mark.slow
def test_the_gpu_recipe_runs_on_the_cpu_at_a_reduced_size(tmp_path):
    """config/gpu.yaml end to end with the GPU profile, made small by one more overlay (sizes, budgets,
    one reader, no control arm, no compile: compiling takes longer than these models train; the dry run
    above has the whole DAG), its Hub source read from a local folder in the Hub's layout. Every job
    asks for a GPU and sees none: it trains on the CPU.
    Two jobs share the GPU here (resources.gpu_share 0.5, `--resources gpu=2` over the profile's
    gpu=1), as the profile says to set it up: two run at once (so the check of the test below, one
    GPU, can see an overlap where there is one), never more. About 1.5 minutes on 2 busy cores."""
    wd = copy_workflow(tmp_path / "wf")
    hub_stories(wd / "data" / "tinystories", 400)
    gpu = yaml.safe_load(GPU.read_text())
    tiny_stories = {**gpu["corpus"]["sources"][0], "hf": "data/tinystories", "max_rows": 300}
    reader = next(s for s in gpu["corpus"]["sources"] if s.get("bundled") == "pg18735_little_red_hen.txt")
    small = {"d0": [16], "L0": [1], "d1": [32], "L1": [2],
             "model": {"head_dim": 8, "context": 32},
             "corpus": {"sources": [tiny_stories, reader]},
             "tokenizer": {"vocab_size": 512},
             "train": {"small": {"tokens": 12000, "lr": 3e-3, "batch_size": 8, "warmup_steps": 5},
                       "large": {"tokens": 24000, "lr": 3e-3, "batch_size": 8, "warmup_steps": 5},
                       "refine": {"warmup_steps": 3}, "eval_interval": 20, "eval_tokens": 2048,
                       "checkpoint_every": 40, "dense_log_steps": 5, "threads": 1, "compile": False},
             "resources": {"mem_mb": 1000, "gpu_share": 0.5},
             "profile": {"tools": ["ncu"]},  # Nsight Compute needs a GPU: torch.profiler's tables, at once
             "controls": {"single_member": False},
             "evaluate": {"test_tokens": 4096}}
    (wd / "smoke.yaml").write_text(yaml.safe_dump(small, sort_keys=False))
    run_snakemake(wd, "--profile", "profiles/gpu", "--resources", "gpu=2", "--cores", "2", "--configfile",
                  "config/config.yaml", "config/gpu.yaml", "smoke.yaml", timeout=600)
    rows = list(csv.DictReader(open(wd / "results" / "gpu" / "eval" / "comparison.csv")))
    assert {r["method"] for r in rows} == {"msg", "concat+zero_block"}
    assert all(float(r["m1_final_val_loss"]) > 0 and r["test_level"] == "tinystories" for r in rows), rows
    source = json.loads((wd / "results" / "gpu" / "corpus" / "sources" / "tinystories" / "source.json").read_text())
    assert (source["kind"], source["hf"], source["split"], source["documents"]) == ("hf", "data/tinystories",
                                                                                  "train", 300)
    plan = json.loads((wd / "results" / "gpu" / "models" / "baseline" / "d32_L2" / "t24000_lr0.003" / "s0" /
                       "plan.json").read_text())
    assert plan["made_for"]["gpu_share"] == 0.5
    for kind in ("small", "baseline", "refine"):  # Nsight Compute without a GPU: torch.profiler's tables, saying why
        folder = wd / "results" / "gpu" / "profile" / "ncu" / kind
        assert json.loads((folder / "tools.json").read_text())["cuda"] is False
        check_profile_tables(folder, "ncu", "torch-cpu")
    intervals = job_intervals(wd / "results" / "gpu")
    assert len(intervals) == 2 + 1 + 2 + 3 + 5 + 1  # members, M_0, refinements, profiles, evaluations
    assert most_at_once(intervals) == 2 and overlaps(intervals), intervals  # two at a time, never three


# ---------------------------------------------------------------------------------------------
# GPU scheduling: at most the declared GPUs' worth of GPU jobs at once
# ---------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_gpu_jobs_never_overlap_under_the_gpu_profile(tiny_run, tmp_path, monkeypatch):
    """The tiny experiment's m_1 and M_0 (two rules), each asking for one GPU (resources.gpu: 1), with the
    GPU profile on a machine of one GPU ($GROWLM_GPUS=0: the profile counts it) and 2 cores: they did
    not run at once, one after the other. (The device is not there, so each job trains on the CPU,
    saying so.) They run again in a copy of the finished tiny run (its corpus and tokens are reused),
    its job timings removed first. That the check sees two GPU jobs that do run at once, and that every
    GPU rule, evaluations and profiling included, is held to the GPUs it was given, is shown by the
    reduced-size run above (two GPUs' worth: two at a time)."""
    workflow_dir = tmp_path / "wf"
    shutil.copytree(tiny_run, workflow_dir, symlinks=True)
    for rule in GPU_RULES:
        shutil.rmtree(workflow_dir / "results" / "tiny" / "benchmarks" / rule, ignore_errors=True)
    (workflow_dir / "gpu1.yaml").write_text("resources: {gpu: 1}\n")
    targets = ["results/tiny/models/small/d16_L1/s0/m1/model.safetensors",
               "results/tiny/models/baseline/d32_L2/t24000_lr0.003/s0/model.safetensors"]
    monkeypatch.setenv("GROWLM_GPUS", "0")
    monkeypatch.setenv("GROWLM_GPU_LOCKS", str(tmp_path / "locks"))
    run_snakemake(workflow_dir, *targets, "--profile", "profiles/gpu", "--cores", "2", "--configfile", str(TINY),
                  "gpu1.yaml", "--forcerun", "train_small", "train_baseline")
    one_gpu = job_intervals(workflow_dir / "results" / "tiny")
    assert len(one_gpu) == 2
    assert not overlaps(one_gpu), overlaps(one_gpu)
    assert most_at_once(one_gpu) == 1
    logs = workflow_dir / "results" / "tiny" / "logs"
    for log in (logs / "train_small" / "d16_L1_s0_m1.log", logs / "train_baseline" / "d32_L2_t24000_lr0.003_s0.log"):
        assert "on cpu" in log.read_text()  # a GPU asked for, none there: the CPU


# ---------------------------------------------------------------------------------------------
# how a job runs: train.compile and resources.gpu_share reach it, and rerun nothing
# ---------------------------------------------------------------------------------------------

def test_how_a_job_runs_reaches_it_outside_the_rerun_trigger(tmp_path, monkeypatch):
    """`params.how` of every training job holds the GPUs, the GPU share and compile; Snakemake counts
    it as derived from the job's resources, so it is not among the params its rerun trigger
    compares (tests/test_reruns.py checks that changing the keys reruns nothing). A compiling run's
    jobs inherit one compile cache in the working folder (on a cluster, /tmp is each node's own)."""
    from snakemake.api import SnakemakeApi
    from snakemake.settings.types import ConfigSettings, DAGSettings, OutputSettings, Quietness, ResourceSettings

    for var in ("TORCHINDUCTOR_CACHE_DIR", "GROWLM_TRAIN_COMPILE"):  # restored after the test
        monkeypatch.setenv(var, "")
        monkeypatch.delenv(var)
    wd = copy_workflow(tmp_path / "wf")
    (wd / "how.yaml").write_text("train: {compile: true, compile_ramps: true}\nresources: {gpu: 1, gpu_share: 0.5}\n")
    with SnakemakeApi(OutputSettings(quiet={Quietness.ALL})) as api:
        wf = api.workflow(resource_settings=ResourceSettings(cores=1), config_settings=ConfigSettings(
            configfiles=[wd / "config" / "config.yaml", TINY, wd / "how.yaml"]),
            snakefile=wd / "workflow" / "Snakefile", workdir=wd)
        wf.dag(DAGSettings(targets={"all"})).execute_workflow(executor="dryrun")
        workflow = wf._workflow
        jobs = [job for job in workflow.dag.jobs if job.rule.name in ("train_small", "train_baseline", "refine")]
        assert {job.rule.name for job in jobs} == {"train_small", "train_baseline", "refine"}
        for job in jobs:
            assert job.params.how == {"gpus": 1, "nodes": 1, "cpus_per_task": 0, "gpu_share": 0.5,
                                      "compile": True, "compile_ramps": True, "sync_every": 0}
            assert not any("gpu_share" in str(p) for p in workflow.persistence._params(job))
        evaluations = [job for job in workflow.dag.jobs if job.rule.name == "evaluate_model"]
        assert evaluations and all(job.resources.gpu == 1 for job in evaluations)
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(wd.resolve() / ".snakemake" / "growlm" / "torchinductor")
    # a cache the user chose is theirs
    from growlm.train_config import export_compile

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))
    export_compile(True, wd)
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "mine")


@pytest.fixture(scope="module")
def grown(tmp_path_factory):
    """A tokenizer, a token file and an msg-grown model (a GrownModel with masks) with its growth.json."""
    from growlm.growth import grow, save_grown
    from growlm.model import build_model
    from growlm.tokenizer import fit_tokenizer, vocab_size

    d = tmp_path_factory.mktemp("grown")
    text = d / "train.txt"
    text.write_text("\n".join(["the cat sat on the mat", "see the dog run", "a red hen"] * 50))
    fit_tokenizer([text], d / "tok", vocab_size=300)
    np.save(d / "t.npy", np.random.default_rng(0).integers(0, 256, 20000).astype(np.uint16))
    member = build_model(seed=1, n_embd=16, n_layer=1, n_positions=16, head_dim=8, vocab_size=vocab_size(d / "tok"))
    model = grow([member], "msg", n_embd=32, n_layer=2, seed=0)
    assert hasattr(model, "set_ramps")  # the masked model, not a plain GPT-2
    save_grown(model, d / "grown")
    (d / "grown" / "growth.json").write_text(json.dumps(
        {"method": "msg", "chain": ["msg"], "options": {}, "growth_flops": 0, "growth_wall_s": 0.0, "members": []}))
    return d


TRAIN = TrainConfig(tokens=8 * 16 * 6, batch_size=8, context=16, lr=1e-3, warmup_steps=1, eval_interval=3,
                    eval_tokens=256, checkpoint_every=3, dense_log_steps=6, seed=1).run_settings()


def test_compile_and_the_share_reach_the_training_config(grown, monkeypatch):
    """The job functions set TrainConfig.compile (a HOW field: the checkpoint fingerprint leaves it
    out) and hand the share to the memory planner."""
    import growlm.jobs.train as jobs

    seen = []
    monkeypatch.setattr(jobs, "run_job", lambda job, **kw: seen.append((job.cfg, job.gpu_share)) or {})
    jobs.train_model(train=TRAIN, model={"n_embd": 16, "n_layer": 1, "n_positions": 16, "head_dim": 8},
                     init_seed=1, role="m1", train_file=grown / "t.npy", val_file=grown / "t.npy",
                     tokenizer_dir=grown / "tok", out_dir=grown / "unused", gpus=1, gpu_share=0.5, compile=True)
    jobs.refine(train=TRAIN, grown_dir=grown / "grown", train_file=grown / "t.npy", val_file=grown / "t.npy",
                tokenizer_dir=grown / "tok", out_dir=grown / "unused", ramps={"ramp_steps": 3}, gpus=1,
                gpu_share=0.25, compile=True)
    assert [(cfg.compile, share) for cfg, share in seen] == [(True, 0.5), (True, 0.25)]
    assert all(cfg.device == "cpu" for cfg, _ in seen)  # a GPU asked for, none visible: the CPU
    assert seen[0][0].run_settings() == TrainConfig.from_dict(TRAIN).run_settings()  # same run, same checkpoints


def test_a_grown_model_compiles_a_few_graphs_not_one_a_step(grown):
    """train.compile on a refinement: the masked model's ramps change every step, as Python floats;
    dynamo traces them as inputs after one recompilation, and once more when the ramps are done (the
    plain GPT-2's forward), so a refinement compiles three graphs, not one per ramp step. (The eager
    backend: dynamo's graphs and guards without inductor's code generation.)"""
    from torch._dynamo.utils import counters

    from growlm.growth import load_grown
    from growlm.loss import lm_loss

    torch._dynamo.reset()
    counters.clear()
    model = load_grown(grown / "grown")
    model.set_ramps(ramp_steps=6)
    compiled = torch.compile(model, backend="eager")
    x = torch.randint(0, model.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    graphs = []
    for step in range(10):
        model.growth_step(step)
        lm_loss(compiled, x, x, logits=False)[0].backward()
        graphs.append(counters["stats"]["unique_graphs"])
    torch._dynamo.reset()
    assert graphs[-1] <= 3 and graphs[5] == graphs[1], graphs  # none while the ramps run


# ---------------------------------------------------------------------------------------------
# the memory planner budgets the job's share of the GPU
# ---------------------------------------------------------------------------------------------

@pytest.fixture
def fake_h100(monkeypatch):
    """torch.cuda answering as one 80 GiB GPU with bf16 (the planner reads no more of it without a
    measured pre-run)."""
    props = types.SimpleNamespace(total_memory=80 * GiB, name="NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda *a, **k: props)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)


def test_the_planner_budgets_the_share_of_the_gpu_it_was_given(fake_h100):
    ctx = P.CUDA_CONTEXT_BYTES
    assert P.device_budget("cuda", None) == (80 * GiB - ctx, int((80 * GiB - ctx) * P.SAFETY))
    assert P.device_budget("cuda", None, 0.25)[0] == 20 * GiB - ctx  # its share, less its own CUDA context
    assert P.device_budget("cuda", 10, 0.5)[0] == 10 * GiB  # the cap when it is smaller
    assert P.device_budget("cuda", 64, 0.5)[0] == 40 * GiB - ctx  # the share when it is smaller
    assert P.device_budget("cpu", 2, 0.25)[0] == 2 * GiB  # no share on the CPU
    for bad in (0, -0.5, 1.5):
        with pytest.raises(GrowlmError, match="gpu_share"):
            P.device_budget("cuda", None, bad)

    # M_0 of config/gpu.yaml: the whole batch of 128 x 512 at once fits the GPU, not a quarter of it
    shape = ModelShape(n_embd=768, n_layer=12, n_head=12, vocab_size=8192, n_positions=512)
    plans = {share: make_plan(shape, context=512, global_batch=128, device="cuda", measure=False, gpu_share=share)
             for share in (1.0, 0.25)}
    whole, quarter = plans[1.0], plans[0.25]
    assert quarter.budget_bytes == int((20 * GiB - ctx) * P.SAFETY)
    assert whole.estimated_peak_bytes <= whole.budget_bytes and quarter.estimated_peak_bytes <= quarter.budget_bytes
    assert whole.estimated_peak_bytes > quarter.budget_bytes  # what fits the whole GPU does not fit a quarter
    assert quarter.micro_batch_size * quarter.grad_accum_steps == whole.micro_batch_size * whole.grad_accum_steps
    # the same global batch (the same run) in smaller micro-batches, or with recomputation
    assert quarter.micro_batch_size < whole.micro_batch_size or quarter.recompute_every != whole.recompute_every


def test_a_plan_is_reused_only_for_the_share_it_was_made_for(tmp_path):
    from growlm.runner import job_plan

    shape = ModelShape(n_embd=32, n_layer=2, n_head=4, vocab_size=128, n_positions=16)
    cfg = TrainConfig(tokens=10**5, batch_size=8, context=16, lr=1e-3, warmup_steps=0)
    said = []
    first, path = job_plan(shape, cfg, tmp_path, memory_limit_gb=1, gpu_share=1.0, log=said.append)
    again, _ = job_plan(shape, cfg, tmp_path, memory_limit_gb=1, gpu_share=1.0, log=said.append)
    other, _ = job_plan(shape, cfg, tmp_path, memory_limit_gb=1, gpu_share=0.5, log=said.append)
    assert first.made_for["gpu_share"] == 1.0 and other.made_for["gpu_share"] == 0.5
    assert any("previous attempt" in s for s in said) and any("other settings" in s for s in said)


def test_a_shared_gpu_holds_the_allocator_to_the_share(monkeypatch):
    from growlm.runner import limit_gpu_memory

    calls = []
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda f, d=None: calls.append((f, str(d))))
    limit_gpu_memory("cuda:0", 0.5)
    limit_gpu_memory("cuda:0", 1.0)  # the whole GPU: nothing to hold
    limit_gpu_memory("cpu", 0.5)
    assert calls == [(0.5, "cuda:0")]


# ---------------------------------------------------------------------------------------------
# refinement under torchrun
# ---------------------------------------------------------------------------------------------

def ledger_losses(path: Path) -> list[tuple[int, str, float]]:
    return [(int(r["step"]), col, float(r[col])) for r in csv.DictReader(open(path))
            for col in ("train_loss", "val_loss") if r[col]]


@pytest.mark.slow
def test_refine_under_torchrun_matches_one_process(grown, tmp_path, monkeypatch):
    """A refinement asking for several GPUs loads the grown model (masks and ramps) in every process of a
    torchrun launch (2 gloo processes on the CPU here, GROWLM_NPROC) and follows the one-process
    refinement's loss curve with the same global batch (DDP averages the two halves' gradients);
    it saves the plain GPT-2 the grown model became, with its ledger, plan and record. About 20 s."""
    from growlm.jobs.train import refine
    from growlm.model import load_model

    kw = dict(train=TRAIN, grown_dir=grown / "grown", train_file=grown / "t.npy", val_file=grown / "t.npy",
              tokenizer_dir=grown / "tok", ramps={"ramp_steps": 3})
    one = tmp_path / "results" / "models" / "refined" / "one"
    refine(out_dir=one, **kw)
    monkeypatch.setenv("GROWLM_NPROC", "2")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    two = tmp_path / "results" / "models" / "refined" / "two"
    summary = refine(out_dir=two, gpus=2, **kw)
    ref, got = ledger_losses(one / "ledger.csv"), ledger_losses(two / "ledger.csv")
    assert [(s, c) for s, c, _ in got] == [(s, c) for s, c, _ in ref] and len(ref) > 6
    for (step, col, a), (_, _, b) in zip(ref, got):
        assert b == pytest.approx(a, rel=1e-4), (step, col, a, b)
    meta = json.loads((two / "growlm.json").read_text())
    assert meta["processes"] == 2 and meta["role"] == "refined" and meta["ramps"] == {"ramp_steps": 3}
    assert meta["growth"]["method"] == "msg" and summary["flops"] > 0
    assert json.loads((two / "plan.json").read_text())["n_devices"] == 2
    a, b = load_model(one), load_model(two)  # plain GPT-2s, loadable without growlm's grown-model code
    for (name, p), q in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.allclose(p, q, atol=1e-4), name


# ---------------------------------------------------------------------------------------------
# setup.sh: which torch
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("smi, index", [
    (None, "CPU build"),
    ("CUDA Version: 12.4", "CPU build"),  # older than every CUDA build of this torch
    ("CUDA Version: 12.6", "whl/cu126"),
    ("CUDA Version: 12.9", "whl/cu128"),  # the newest build not above the driver's CUDA
    ("CUDA Version: 13.0", "whl/cu130"),
    ("CUDA Version: 13.2", "whl/cu130"),
    ("failed", "CPU build"),  # nvidia-smi there, no working driver
])
def test_setup_chooses_the_torch_build_from_the_nvidia_driver(tmp_path, smi, index):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if smi == "failed":
        (bin_dir / "nvidia-smi").write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed because it could not "
                                            "communicate with the NVIDIA driver.'\nexit 9\n")
    elif smi:
        (bin_dir / "nvidia-smi").write_text(f"#!/bin/sh\necho '| NVIDIA-SMI 580.65.06   Driver Version: 580.65.06"
                                            f"   {smi}     |'\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "TORCH_INDEX"}
    env["PATH"] = f"{bin_dir}:/usr/bin:/bin"
    said = subprocess.run(["bash", str(REPO / "setup.sh"), "--which-torch"], env=env, capture_output=True,
                          text=True, check=True).stdout
    assert index in said and ": " in said, said  # which build, and why
    env["TORCH_INDEX"] = "https://example.org/whl/mine"
    said = subprocess.run(["bash", str(REPO / "setup.sh"), "--which-torch"], env=env, capture_output=True,
                          text=True, check=True).stdout
    assert said.startswith("torch 2.13.0 from https://example.org/whl/mine: TORCH_INDEX is set"), said
