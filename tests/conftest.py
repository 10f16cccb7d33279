"""Shared fixtures: a copy of the workflow in a temporary folder, and a Snakemake runner."""

from __future__ import annotations

import functools
from collections import Counter
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = [sys.executable, "-m", "snakemake"]
TINY = REPO / "tests" / "config" / "tiny.yaml"

# One CPU thread for torch in every test process and in every process the tests start, unless a job sets its
# own (a workflow job computes on train.threads, the tiny experiment's 1). The two pytest-xdist workers share
# the machine's cores with the jobs their Snakemake runs start: torch's default of a thread per core in each
# of them makes OpenMP threads wait on each other (measured on 2 cores: test_train, test_plan, test_moments,
# test_vcycle and test_growth took 88 s on two workers at torch's default, 14 s on one thread each).
os.environ.setdefault("OMP_NUM_THREADS", "1")
if "torch" in sys.modules:  # imported before this file (a plugin): the variable came too late for it
    sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


def learnable_tokens(vocab: int, n: int = 20000, seed: int = 0) -> np.ndarray:
    """A token stream a tiny model learns within a few dozen steps: 0, 1, ..., vocab-1 repeated, with
    10 % of the tokens replaced by noise."""
    rng = np.random.default_rng(seed)
    base = np.tile(np.arange(vocab, dtype=np.uint16), n // vocab + 1)[:n]
    noise = rng.integers(0, vocab, n).astype(np.uint16)
    return np.where(rng.random(n) < 0.1, noise, base).astype(np.uint16)


def perturbed(model, seed: int, *, norms: str = "norm"):
    """`model` in float64 with its norm parameters (names containing `norms`) and biases perturbed and its
    matrices scaled up, so that an exactness test sees mistakes there (GPT-2's init keeps them small and
    its norms at 1 and 0, where many wrong algebras still agree). Returned in eval mode."""
    import torch  # here, not at the top: most test files need no torch

    m = model.double()
    g = torch.Generator().manual_seed(100 + seed)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if norms in name or "bias" in name:
                p.add_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.3)
            elif p.dim() == 2:
                p.mul_(3.0)  # larger weights than the init: non-linear effects are not negligible
    return m.eval()


def copy_workflow(dest: Path) -> Path:
    """The workflow files (not results) in `dest`, with the bundled corpus linked."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("workflow", "profiles", "config", "tests", "examples"):
        shutil.copytree(REPO / name, dest / name, ignore=shutil.ignore_patterns("__pycache__", "results", "resources"))
    (dest / "workflow" / "resources").symlink_to(REPO / "workflow" / "resources")
    return dest


@functools.cache
def _no_controller_slurm_conf() -> Path:
    """A slurm.conf whose controller answers 'unreachable' at once (MessageTimeout=1).

    Snakemake imports its SLURM executor plugin on every start, and the plugin runs
    `scontrol show config` at import. Once tests/test_slurm.py has installed SLURM and stopped its
    cluster, /etc/slurm/slurm.conf names a controller that is down, and each scontrol call waits
    about 9 s for it (MessageTimeout=10): 9 s added to every local Snakemake run after the SLURM
    tests. Every other process the tests start gets this file as SLURM_CONF instead; the cluster tests do
    not use it."""
    import tempfile

    path = Path(tempfile.gettempdir()) / "growlm-tests-no-slurmctld.conf"
    path.write_text("ClusterName=none\nSlurmctldHost=localhost\nMessageTimeout=1\n"
                    "NodeName=localhost CPUs=1\nPartitionName=none Nodes=localhost\n")
    return path


# Every process the tests start sees that file, whoever starts it (run_snakemake, a test's own subprocess, a
# benchmark's smoke run, Snakemake's API in this process); tests/slurm_cluster.py's `cluster_env` takes it out
# again for what talks to the test cluster.
os.environ["SLURM_CONF"] = str(_no_controller_slurm_conf())


def pytest_configure(config):
    """GROWLM_TEST_COSTS=FOLDER records what each test starts, for the table of tests/README.md
    (tests/suite_costs.py)."""
    if os.environ.get("GROWLM_TEST_COSTS"):
        from suite_costs import Recorder

        config.pluginmanager.register(Recorder(os.environ["GROWLM_TEST_COSTS"]), "growlm-test-costs")


# The test files that take longest, longest first (seconds of a whole run, tests/README.md). pytest-xdist
# (`--dist loadfile --no-loadscope-reorder`, pyproject.toml) hands each worker a whole file at a time in the
# collection order: the long files start early and the many short ones fill both workers' ends, instead of
# the default order (by number of tests) that started the longest single-test files last. The SLURM file
# first: it mostly waits on the scheduler, and the other worker's work runs beside it. A file not named
# here keeps its place after these.
LONGEST_FIRST = (
    "test_slurm.py", "test_identity.py", "test_pretrained.py", "test_combine.py", "test_offline.py",
    "test_workflow.py", "test_workflow_gpus.py", "test_gpu_recipe.py", "test_envelope_workflow.py",
    "test_sources.py", "test_own_results.py", "test_tasks.py", "test_interrupt.py", "test_kill_resume.py",
    "test_bench_smoke.py", "test_distributed.py", "test_readme.py", "test_reruns.py",
)


def pytest_collection_modifyitems(config, items):
    """The collection in LONGEST_FIRST's order of files (a stable sort: tests keep their order in a file)."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


def copy_run(run: Path, dest: Path, remove=(), tiny: tuple[str, ...] = ()) -> Path:
    """A copy of a finished run's folder (file dates kept: Snakemake plans in the copy what it would plan in
    the run) less the paths `remove` (relative to the folder) and `tiny` (relative to results/tiny/)."""
    shutil.copytree(run, dest, symlinks=True)
    for path in [*remove, *(f"results/tiny/{p}" for p in tiny)]:
        shutil.rmtree(dest / path, ignore_errors=True)
    return dest


def alive(pid: int) -> bool:
    """Whether process `pid` is running (Linux's /proc; a zombie, ended but not yet reaped, is not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def run_snakemake(workdir: Path, *args: str, check: bool = True, timeout: int = 900) -> subprocess.CompletedProcess:
    """Snakemake with the local executor (the cluster tests use tests/slurm_cluster.py)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "SLURM_CONF": str(_no_controller_slurm_conf())}
    proc = subprocess.run([*SNAKEMAKE, *args], cwd=workdir, capture_output=True, text=True, timeout=timeout, env=env)
    if check and proc.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout[-6000:]}\n{proc.stderr[-6000:]}")
    return proc


def check_profile_tables(folder: Path, tool: str, made_by: str) -> None:
    """A profiling job's tables (summary.csv, phases.csv) name the profiler that made them and the tool
    asked for; a fallback says which tool it stands in for and why; every phase of a step was timed."""
    import pandas as pd

    summary = pd.read_csv(folder / "summary.csv")
    assert summary.loc[0, "profiler"] == made_by and summary.loc[0, "requested_tool"] == tool
    assert summary.loc[0, "window_steps"] > 0 and summary.loc[0, "peak_memory_mb"] > 0
    if made_by == "torch-cpu":
        assert f"{tool}:" in summary.loc[0, "notes"]  # the fallback names the tool and why
    phases = pd.read_csv(folder / "phases.csv")
    assert {"data", "forward", "backward", "optimizer"} <= set(phases["phase"])
    assert (phases["profiler"] == made_by).all() and (phases["total_ms"] > 0).all()


def job_counts(dry_run_stdout: str) -> dict[str, int]:
    """Parse the 'Job stats' table of a dry run into {rule: count}."""
    counts, in_table = {}, False
    for line in dry_run_stdout.splitlines():
        parts = line.split()
        if parts[:2] == ["job", "count"]:
            in_table = True
            continue
        if in_table:
            if len(parts) == 2 and parts[1].isdigit():
                if parts[0] != "total":
                    counts[parts[0]] = int(parts[1])
            elif parts and not set(line.strip()) <= {"-", " "}:
                break
    return counts


@pytest.fixture
def workflow_dir(tmp_path: Path) -> Path:
    return copy_workflow(tmp_path / "wf")


def plan(workflow_dir: Path, *config: str, configfiles=(), targets=("all",),
         force: bool = False, until=()) -> tuple[str | None, list[tuple[str, list[str]]]]:
    """The workflow parsed and planned in this process through Snakemake's API, as `snakemake -n --config
    *config --configfile config/config.yaml *configfiles [--force] [--until *until] [-- *targets]` plans it
    (`--config` values read by the command line's own snakemake.cli.parse_config; the folder's profiles/default's rerun triggers
    and checksum size, so a folder with results plans what the command line plans there; the Snakefile reads
    that command line as sys.argv, as growlm's checks of a forced target do, and its executor from it, the
    local one (growlm.launch.snakemake_executor: the machine's GROWLM_GPUS check and GPU count apply as in
    `snakemake -n`); the environment variables it sets for its jobs are undone after): (the error the parse
    raised, or None; the rule and outputs of each job that needs to run, none for a finished run). About a
    tenth of a Snakemake start. Not for what needs the command line itself (a YAML tag in --config, jobs
    across nodes through a SLURM profile) or what the terminal shows: those are real `snakemake -n` runs."""
    import yaml
    from snakemake.api import SnakemakeApi
    from snakemake.cli import parse_config, parse_size_in_bytes
    from snakemake.exceptions import WorkflowError
    from snakemake.settings.types import (
        ConfigSettings,
        DAGSettings,
        OutputSettings,
        Quietness,
        RerunTrigger,
        ResourceSettings,
    )

    files = [workflow_dir / "config" / "config.yaml", *(Path(workflow_dir, f) for f in configfiles)]
    profile = yaml.safe_load((Path(workflow_dir, "profiles", "default", "config.yaml")).read_text())
    dag_settings = DAGSettings(targets=set(targets), forcetargets=force, until=frozenset(until),
                               rerun_triggers=RerunTrigger.parse_choices_set(profile["rerun-triggers"]),
                               max_checksum_file_size=parse_size_in_bytes(profile["max-checksum-file-size"]))
    argv = ["snakemake", "-n", "--cores", "1", *(["--configfile", *map(str, configfiles)] if configfiles else []),
            *(["--config", *config] if config else []), *(["--force"] if force else []),
            *(["--until", *until] if until else []),
            *(["--", *targets] if tuple(targets) != ("all",) else [])]  # `all`: no target named
    saved_argv, sys.argv, saved_env = sys.argv, argv, dict(os.environ)
    try:
        with SnakemakeApi(OutputSettings(quiet={Quietness.ALL})) as api:
            wf = api.workflow(resource_settings=ResourceSettings(cores=1), snakefile=workflow_dir / "workflow" /
                              "Snakefile", workdir=workflow_dir, config_settings=ConfigSettings(
                                  config=parse_config(list(config)), configfiles=files))
            wf.dag(dag_settings).execute_workflow(executor="dryrun")
            dag = wf._workflow.dag
            return None, [(job.rule.name, [str(f) for f in job.output]) for job in dag.jobs
                          if job.rule.name != "all" and dag.needrun(job)]
    except WorkflowError as err:
        return str(err), []
    finally:  # what the Snakefile set for its jobs (the user's command, thread counts) goes with it
        sys.argv = saved_argv
        os.environ.clear()
        os.environ.update(saved_env)



def planned_counts(workflow_dir: Path, *config: str, configfiles=(), targets=("all",), until=()) -> Counter:
    """{rule: number of jobs} that `plan` finds to run (asserting the workflow parsed without an error)."""
    error, jobs = plan(workflow_dir, *config, configfiles=configfiles, targets=targets, until=until)
    assert error is None, error
    return Counter(rule for rule, _ in jobs)

@functools.cache
def code_digest() -> str:
    """sha256 of what a workflow run executes and reads besides its config files: the workflow (rules, scripts,
    the library, schemas, the bundled corpus), the profiles, config/ and examples/."""
    digest = hashlib.sha256()
    for name in ("workflow", "profiles", "config", "examples"):
        for path in sorted((REPO / name).rglob("*")):
            if path.is_file() and not {"__pycache__", "results"} & set(path.parts):
                digest.update(str(path.relative_to(REPO)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def finished_run(tmp_path_factory, name: str, commands: list[list[str]], *, files: dict[str, str] | None = None,
                 start_from: Path | None = None, remove: tuple[str, ...] = (),
                 copies: dict[str, str] | None = None, make=None) -> Path:
    """A real run made once for the whole session and shared by every test that asks for the same one: a copy
    of the workflow (or of the finished run `start_from`, less the paths `remove`), `files` written into it
    (overlays), `copies` made in it ({destination: source}, paths in the folder; file dates kept), what the
    function `make` writes into it given the folder (files made in code: members' weights), then each
    Snakemake command in turn (each must succeed; what command i printed, its standard output then its
    standard error, is in `run_output(folder, i)`: a run's plan, said as it starts, is in the latter).

    It is keyed by what makes it: the commands, the files' text, the config files a command names, what it
    starts from, `make`'s name and the code (`code_digest`): two fixtures asking for the same run share one. The tests run
    in pytest-xdist workers (a file per worker, `--dist loadfile`): the first worker that needs the run makes
    it in the folder all workers share, under a file lock; the others wait for it and reuse it. A run that
    failed is not tried again: every test that asks for it fails, naming the first failure. The tests only
    read it; a test that changes it copies it first (`shutil.copytree(run, dest, symlinks=True)`: file dates
    kept, so Snakemake plans in the copy what it would plan in the run)."""
    import fcntl

    files = files or {}
    key = hashlib.sha256(json.dumps([commands, files, str(start_from), code_digest(), *([copies] if copies else []),
                                     *([f"{make.__module__}.{make.__qualname__}"] if make else [])]).encode())
    for word in (w for command in commands for w in command if w.endswith((".yaml", ".yml"))):
        if Path(word).is_file():  # a config file outside the run's folder (tests/config/tiny.yaml)
            key.update(Path(word).read_bytes())
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # .../pytest-N/popen-gwK -> .../pytest-N, the same for every worker
    folder = shared / "runs" / f"{name}-{key.hexdigest()[:12]}"
    wd, done, failed = folder / "wf", folder / "done", folder / "failed"
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # the other worker is making it: wait (tests/suite_costs.py counts the wait)
            if os.environ.get("GROWLM_TEST_COSTS"):
                from suite_costs import note

                note("waits")
            fcntl.flock(lock, fcntl.LOCK_EX)
        if failed.exists():
            pytest.fail(f"the shared run {name} failed in an earlier test:\n{failed.read_text()}")
        if not done.exists():
            shutil.rmtree(wd, ignore_errors=True)
            try:
                if start_from is None:
                    copy_workflow(wd)
                else:
                    copy_run(start_from, wd, remove)
                for file, text in files.items():
                    (wd / file).write_text(text)
                for dest, source in (copies or {}).items():
                    shutil.copytree(wd / source, wd / dest, symlinks=True)
                if make is not None:
                    make(wd)
                for i, command in enumerate(commands):
                    proc = run_snakemake(wd, *command)
                    run_output(wd, i).write_text(proc.stdout + proc.stderr)
            except BaseException as err:
                failed.write_text(f"{type(err).__name__}: {err}"[-20000:])
                raise
            done.touch()
    return wd


def run_output(run: Path, i: int) -> Path:
    """The file that holds what command i of a shared run printed (finished_run)."""
    return run.parent / f"command{i}.out"


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory) -> Path:
    """One real run of the whole DAG on the tiny config and its report, shared by the tests that inspect it
    (they only read it)."""
    return finished_run(tmp_path_factory, "tiny", [["--cores", "2", "--configfile", str(TINY)],
                        ["--cores", "1", "--configfile", str(TINY), "--report", "results/tiny/report.html"]])


# The second experiment of `tiny2_run`: the tutorial's operator refined with teachers and its refiner after msg
# beside [merge, msg], the members branching from one shared trunk, each on its own cluster of books; no
# profiling, no control arms. Three arms, each with what the tests read of it: the plugin operator and the
# teachers (both use the two members) share one, and msg alone is the arm that uses m_1 only.
TINY2 = """\
experiment: tiny2
methods: [[merge, msg], [average_then_grow, teach], [msg, smooth_labels]]
members: {data: clusters, shards: 2, trunk: 0.5}
grow: {plugins: [examples/average_then_grow.py, examples/smooth_labels.py]}
controls: {single_member: false, ensemble: false}
profile: {tools: []}
"""


@pytest.fixture(scope="session")
def tiny2_run(tiny_run, tmp_path_factory) -> Path:
    """The finished tiny run's folder with a second experiment, `tiny2` (other settings, TINY2), run to its
    report beside it: the plugins and the shared trunk through the workflow (tests/test_combine.py), and two
    experiments in one folder (tests/test_own_results.py). One run serves both. TINY2 changes neither the
    corpus, the tokenizer nor M_0: the tiny experiment's are copied into tiny2's folder first (the same
    settings make the same files), and tiny2 trains and evaluates what is its own."""
    args = ["--configfile", str(TINY), "tiny2.yaml"]
    return finished_run(tmp_path_factory, "tiny2", [["--cores", "2", *args],
                        ["--cores", "1", *args, "--report", "results/tiny2/report.html"]],
                        files={"tiny2.yaml": TINY2}, start_from=tiny_run,
                        copies={f"results/tiny2/{p}": f"results/tiny/{p}"
                                for p in ("corpus", "tokenizer", "tokens", "models/baseline")})


@pytest.fixture(scope="session")
def pretrained_run(tiny_run, tmp_path_factory) -> Path:
    """Two Llama members brought to the tiny experiment (tests/test_pretrained.py's `pretrained_overlay`: of
    width 32, not the config's d0, grown to width 64 by msg from member 1 and by [concat, zero_block] from
    both), run in a copy of the shared tiny run that keeps its corpus only, up to the report's first page and
    the six token files (what its command printed, which says what ran: `run_output(folder, 0)`). The members
    lie in the run's folder and the config names them by relative paths, so a copy of the run (`copy_run`) is
    a finished run of its own copy of them. Read by the Llama members' test (tests/test_pretrained.py) and,
    in copies that change the members, by the members-known-by-content test (tests/test_identity.py): one run
    serves both."""
    from test_pretrained import PRETRAINED_TARGETS, make_pretrained, pretrained_overlay

    made = ("tokenizer", "tokens", "models", "checkpoints", "eval", "report", "profile", "live")
    return finished_run(tmp_path_factory, "pretrained", [[*PRETRAINED_TARGETS, "--cores", "2", "--configfile",
                                                          str(TINY), "pre.yaml"]],
                        files={"pre.yaml": pretrained_overlay()}, start_from=tiny_run,
                        remove=tuple(f"results/tiny/{p}" for p in made), make=make_pretrained)


@pytest.fixture(autouse=True)
def _no_inherited_command(monkeypatch):
    """growlm.hints reads the user's command from the environment a Snakemake run sets, and the Snakefile
    names its library and its own process for the jobs (GROWLM_LIBRARY, PYTHONPATH, GROWLM_PARENT_PID,
    growlm.launch.run_environment); a test that parses the workflow in-process
    (tests/test_reruns.py) must not leave them to the tests after it."""
    monkeypatch.delenv("GROWLM_COMMAND", raising=False)
    monkeypatch.delenv("GROWLM_LIBRARY", raising=False)
    for name in ("GROWLM_PARENT_PID", "GROWLM_GPUS_PLACED_BY", "GROWLM_GPU_SLOTS", "CUDA_DEVICE_ORDER"):  # for its jobs
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))  # put back as it was after the test
    if not os.environ["PYTHONPATH"]:
        monkeypatch.delenv("PYTHONPATH")


def validated_config(*overlays: dict) -> dict:
    """config/config.yaml under the overlays (dicts, merged in order), validated and filled with the schema's
    defaults as the Snakefile does: a config the library's functions take, without parsing the workflow."""
    import copy

    import yaml
    from snakemake.utils import validate

    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())

    def merge(a, b):
        for k, v in b.items():
            if isinstance(v, dict) and isinstance(a.get(k), dict):
                merge(a[k], v)
            else:
                a[k] = copy.deepcopy(v)

    for overlay in overlays:
        merge(config, overlay)
    validate(config, str(REPO / "workflow" / "schemas" / "config.schema.yaml"))
    return config
