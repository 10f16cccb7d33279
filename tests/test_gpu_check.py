"""bench/gpu_check, the one command of every GPU figure, checked on the CPU.

`--smoke` runs the same parts at tiny sizes: env, MFU beside the reference loop (`bench/gpu.py --cpu-smoke`),
the refinement benchmark (`bench/refine_speed.py --quick`; what both print is checked too, in their logs)
and the workflow (on a copy of the shared tiny run, which Snakemake continues), each writing its CSV
folder; ncu and the memory planner, which need a GPU, are skipped with one line saying why, and the
summary names every part. The orchestration itself is checked on small commands: a part that fails, one
stopped at the time limit, one that would not fit and one whose tool is missing leave the others
running, and every one of them is in the summary.
"""

from __future__ import annotations

import csv
import math
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import REPO, _no_controller_slurm_conf, job_counts, run_snakemake

sys.path.insert(0, str(REPO / "bench"))
import gpu_check  # noqa: E402
from gpu_check_parts import GPU_OVERLAY, SHAPE, WORKFLOW_CUT, Part, workflow_targets  # noqa: E402


def rows(path: Path) -> list[dict]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def test_smoke_runs_every_part_it_can_and_names_the_rest(tiny_run, tmp_path):
    wd = tmp_path / "wf"
    shutil.copytree(tiny_run, wd, symlinks=True)
    out = tmp_path / "figures"
    env = {**os.environ, "SLURM_CONF": str(_no_controller_slurm_conf())}
    proc = subprocess.run([str(REPO / "bench" / "gpu_check"), "--smoke", "--out", str(out), "--work",
                           str(tmp_path / "work"), "--workflow-dir", str(wd)], env={**env, "PYTHON": sys.executable},
                          capture_output=True, text=True, timeout=900)
    said = proc.stdout + proc.stderr
    assert proc.returncode == 0, said[-4000:]
    summary = {r["part"]: r for r in rows(out / "summary.csv")}
    assert list(summary) == ["env", "mfu", "refine", "memory", "workflow", "ncu"]
    assert [p for p, r in summary.items() if r["ran"] == "yes"] == ["env", "mfu", "refine", "workflow"], summary
    assert summary["ncu"]["status"].startswith("skipped: ") and "ncu" in summary["ncu"]["status"]  # no GPU here
    assert summary["memory"]["status"] == "skipped: no CUDA device (bench/memory.py --gpu caps the CUDA allocator)"
    for part in summary:  # the printed table names every part, and the last line which ran
        assert f"\n{part} " in said
    assert "gpu_check ran=env,mfu,refine,workflow skipped=memory,ncu failed= " in said

    found = {r["key"]: r["value"] for r in rows(out / "env" / "env.csv")}
    assert found["torch"].startswith("2.") and found["cuda"] == "False" and found["python"] == sys.version.split()[0]
    # mfu is `bench/gpu.py --cpu-smoke`: growlm's loop beside the reference loop, in the same process
    assert "MFU n/a" in (out / "mfu" / "log.txt").read_text()
    assert (out / "mfu" / "mfu_eager.csv").read_text().startswith("d,")
    mfu = rows(out / "mfu" / "mfu_eager.csv")
    assert [r["d"] for r in mfu] == ["32", "64"]
    assert all(float(r["tokens_per_s"]) > 0 and float(r["ratio_to_reference"]) > 0 and float(r["ref_tokens_per_s"]) > 0
               for r in mfu)
    refine = rows(out / "refine" / "refine_speed.csv")  # `bench/refine_speed.py --quick`
    assert {(r["compile"], r["arm"]) for r in refine} == {("off", a) for a in ("msg", "concat", "vcycle")}
    assert all(float(r["during"]) > 0 and float(r["after"]) > 0 for r in refine)
    printed = (out / "refine" / "log.txt").read_text().strip().splitlines()
    m = re.fullmatch(r"refine_speed during=([0-9.]+) after=([0-9.]+)", printed[-1])
    assert m and float(m.group(1)) > 0 and float(m.group(2)) > 0, printed[-20:]
    assert {"msg", "concat", "vcycle"} <= {line.split()[1] for line in printed if line.startswith("    off")}

    jobs = rows(out / "workflow" / "rules.csv")  # every job of the tiny run, with its wall time
    by_rule = {r["rule"] for r in jobs}
    assert {"train_small", "train_baseline", "grow", "refine", "evaluate_model", "compare"} <= by_rule
    assert all(float(r["seconds"]) > 0 and r["recompiles"] == "0" for r in jobs)
    totals = rows(out / "workflow" / "rule_totals.csv")
    assert sum(int(t["jobs"]) for t in totals) == len(jobs)
    training = rows(out / "workflow" / "training.csv")
    assert {r["model"].split("/")[0] for r in training} == {"small", "baseline", "refined"}
    assert all(float(r["tokens_per_s"]) > 0 and r["device"] == "cpu" for r in training)
    methods = {r["method"] for r in rows(out / "workflow" / "comparison.csv")}
    assert methods == {"hyperclone+zero_block", "concat+zero_block", "concat+zero_block@m1"}, methods
    run = rows(out / "workflow" / "run.csv")[0]
    assert run["result"] == "finished" and int(run["jobs"]) == len(jobs)
    assert "[corpus jobs started early:" in (out / "workflow" / "log.txt").read_text()  # while mfu and refine ran
    assert all(r["cut"] == "" for r in summary.values())  # the smoke run cuts nothing of the tiny experiment


def test_a_part_that_fails_or_does_not_fit_leaves_the_others_running(tmp_path, monkeypatch):
    def command(code: str):
        return lambda ctx, folder: ctx.run([sys.executable, "-c", code.replace("FOLDER", str(folder))],
                                           log=folder / "log.txt")

    def figures(ctx, folder):
        return (folder / "x.csv").read_text().split()[-1]

    writes = command("open('FOLDER/x.csv', 'w').write('x\\n7\\n')")
    selected = [
        Part("fails", "exits 3", 1, 1, command("import sys; print('it broke here'); sys.exit(3)"), figures),
        Part("runs", "writes its CSV", 1, 1, writes, figures),
        Part("slow", "past the time limit", 1, 1, command("open('FOLDER/x.csv', 'w').write('x\\n5\\n'); "
                                                          "import time; time.sleep(120)"), figures),
        Part("big", "would not fit", 1000, 1000, writes, figures),
        Part("tool", "needs a tool", 1, 1, writes, figures, needs=lambda ctx: "no such tool here"),
    ]
    monkeypatch.setattr(gpu_check, "GRACE", 1)  # SIGTERM one second before the limit
    ctx = gpu_check.Context(out=tmp_path / "out", work=tmp_path / "work", smoke=True,
                            deadline=time.monotonic() + 8, env=dict(os.environ))
    t0 = time.monotonic()
    said = []
    got = {r.part: r for r in gpu_check.run_parts(selected, ctx, say=said.append)}
    assert time.monotonic() - t0 < 60  # the sleeping part was stopped at the limit
    assert got["fails"].status == "failed: exit 3: it broke here" and not got["fails"].ran
    assert got["runs"].status == "ran" and got["runs"].ran and got["runs"].figures == "7"
    assert got["slow"].status.startswith("stopped at the time limit") and got["slow"].figures == "5"  # kept
    assert got["big"].status.startswith("skipped: needs about 1000 s, ") and not got["big"].ran
    assert got["tool"].status == "skipped: no such tool here"
    summary = rows(ctx.out / "summary.csv")
    assert [(r["part"], r["ran"]) for r in summary] == [("fails", "no"), ("runs", "yes"), ("slow", "no"),
                                                        ("big", "no"), ("tool", "no")]
    assert "it broke here" in (ctx.out / "fails" / "log.txt").read_text()
    assert any(line.startswith("[runs] ran in") for line in said)


def test_the_summary_says_what_a_part_cut_and_early_work_starts_after_env_only_for_parts_that_run(tmp_path):
    started = []

    def early(name):
        return lambda ctx: started.append((name, sorted(ctx.ran)))

    def writes(ctx, folder):
        (folder / "x.csv").write_text("x\n1\n")

    selected = [Part("env", "first", 1, 1, writes, lambda ctx, f: ""),
                Part("work", "cut to fit", 1, 1, writes, lambda ctx, f: "", cut=lambda ctx: "cut to fit: half of it",
                     early=early("work")),
                Part("other", "not asked for", 1, 1, writes, lambda ctx, f: "", early=early("other"))]
    ctx = gpu_check.Context(out=tmp_path / "out", work=tmp_path / "work", smoke=True,
                            deadline=time.monotonic() + 60, env=dict(os.environ))
    got = gpu_check.run_parts(selected, ctx, asked={"env", "work"}, say=lambda s: None)
    assert started == [("work", ["env"])]  # once env ran, and not for the part left out
    summary = {r["part"]: r for r in rows(ctx.out / "summary.csv")}
    assert summary["work"]["cut"] == "cut to fit: half of it" and summary["env"]["cut"] == ""
    assert "cut to fit: half of it" in gpu_check.table(got)


def test_the_parts_fit_the_default_time_limit_with_a_margin():
    """On one H100 the parts took env 13-18 s, mfu 123 s for two widths, refine 149 s, memory 56 s
    (bench/results/gpu_check_h100/). The workflow part's estimate is at least the critical path of its cut DAG in
    that run's job times (workflow_rules.csv; members and M_0 side by side, then grow, the refinement, M_1's
    evaluation, the comparison). Together the estimates leave at least a tenth of the default 8 minutes, and a
    part run at more sizes or modes is estimated at more. The workflow's estimate, the least sure (its jobs ran one
    GPU job at a time there; here three share the GPU), runs after every part but ncu (which reads its tables), so
    it may take half as long again as its estimate with every part still run."""
    from gpu_check_parts import PARTS

    jobs = {}
    for r in csv.DictReader(open(REPO / "bench/results/gpu_check_h100/workflow_rules.csv")):
        jobs.setdefault(r["rule"], {})[r["job"]] = float(r["seconds"])
    msg = lambda rule: next(s for job, s in jobs[rule].items() if job.startswith("msg"))  # noqa: E731
    path = (max(*jobs["train_small"].values(), *jobs["train_baseline"].values()) + msg("grow")
            + max(msg("refine"), *jobs["profile"].values()) + max(jobs["evaluate_model"].values())
            + jobs["plans_table"][""])  # the comparison, a job of the same kind
    measured = {"env": 18, "mfu": 123 / 2, "refine": 149, "workflow": path}
    estimates = {p.name: p.seconds for p in PARTS}
    assert all(estimates[name] >= s for name, s in measured.items()), (estimates, measured)
    assert sum(estimates.values()) <= 8 * 60 * 0.9, estimates
    names = [p.name for p in PARTS]
    assert names[names.index("workflow") + 1:] == ["ncu"], names
    assert 8 * 60 - sum(s for name, s in estimates.items() if name != "workflow") >= 1.5 * estimates["workflow"]
    mfu = next(p for p in PARTS if p.name == "mfu")
    two = SimpleNamespace(smoke=False, options={"mfu_modes": ["default"], "mfu_sizes": ["768", "1024"]})
    one = SimpleNamespace(smoke=False, options={"mfu_modes": ["default"], "mfu_sizes": ["768"]})
    assert mfu.estimate(two) == 2 * mfu.estimate(one) >= 123
    assert "d 1024" in mfu.cut(one) and not mfu.cut(two)


def test_unknown_parts_are_refused_naming_the_parts(capsys):
    with pytest.raises(SystemExit):
        gpu_check.main(["--only", "mfu,gpus", "--out", "/nonexistent"])
    assert "unknown part(s) gpus: the parts are env, mfu, refine, memory, workflow, ncu" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # a width that is not one, before any part runs
        gpu_check.main(["--mfu-sizes", "768,1k", "--out", "/nonexistent"])
    assert "--mfu-sizes '768,1k': widths d are positive integers" in capsys.readouterr().err


def test_break_even_ramp_is_compile_seconds_over_seconds_saved_per_step():
    import refine_speed

    rows_ = [{"compile": "on", "arm": "msg", "arm_compile_s": 20.0, "during_tok_s": 100_000.0},
             {"compile": "ramps", "arm": "msg", "arm_compile_s": 45.0, "during_tok_s": 250_000.0},
             {"compile": "on", "arm": "concat", "arm_compile_s": 20.0, "during_tok_s": 100_000.0},
             {"compile": "ramps", "arm": "concat", "arm_compile_s": 50.0, "during_tok_s": 90_000.0}]
    even = refine_speed.break_even(rows_, tokens_per_step=32768)
    saved = 32768 / 100_000 - 32768 / 250_000  # seconds per ramp step
    assert even["msg"] == pytest.approx(25.0 / saved)
    assert math.isinf(even["concat"])  # its compiled masked step is slower: it never pays


def test_the_workflow_overlay_dry_runs_offline_at_the_measured_shapes(workflow_dir):
    """bench/gpu_check.yaml builds its DAG with the GPU profile (no network: bundled readers only), and its
    large models have the shapes `mfu` and `refine` measure, so their compiled graph is one."""
    import yaml

    overlay = yaml.safe_load(GPU_OVERLAY.read_text())
    shape = dict(zip(SHAPE[::2], SHAPE[1::2]))
    assert (overlay["d1"], overlay["L1"], overlay["d0"], overlay["L0"]) == ([768], [12], [384], [6])
    assert [str(overlay["L1"][0]), str(overlay["model"]["context"]), str(overlay["tokenizer"]["vocab_size"]),
            str(overlay["model"]["head_dim"]), str(overlay["train"]["large"]["batch_size"])] == [
        shape["--layers"], shape["--context"], shape["--vocab"], shape["--head-dim"], shape["--batch"]]
    assert all("bundled" in s for s in overlay["corpus"]["sources"])  # no network
    ctx = gpu_check.Context(out=workflow_dir, work=workflow_dir, smoke=False, deadline=0, env={},
                            found={"ncu": {"works": True}})
    proc = run_snakemake(workflow_dir, *workflow_targets(ctx), "-n", "--quiet", "rules", "--profile", "profiles/gpu",
                         "--configfile", "config/config.yaml", str(GPU_OVERLAY))
    counts = job_counts(proc.stdout)  # cut to fit the check's 8 minutes (WORKFLOW_CUT says what)
    assert counts == {"prepare_source": 9, "build_level": 2, "fit_tokenizer": 1, "encode_split": 6, "train_small": 2,
                      "train_baseline": 1, "grow": 1, "refine": 1, "profile": 2, "evaluate_model": 4, "compare": 1}
    assert len(overlay["corpus"]["sources"]) == 9 and "18 of the 27 bundled books" in WORKFLOW_CUT
    assert overlay["methods"] == ["msg"] and "the concat arm" in WORKFLOW_CUT
