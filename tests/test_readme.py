"""Every command printed in the README and the manual (docs/*.md) runs, so the documentation cannot drift
from what works.

The commands are the lines of the ```bash blocks of README.md and of every page of docs/. Each must match
one of the ways below to run it: long runs as a dry run, the report on the tiny experiment's finished run
(the tiny config is added where a real run is needed), the rest for real. A command that matches none
fails the test, so a new command cannot go unchecked. The README holds the two commands for a fresh
machine and no other; a command is printed once, on the page of its topic.
"""

from __future__ import annotations

import glob
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, SNAKEMAKE, TINY, copy_workflow, job_counts, run_snakemake


PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def page_commands(page: Path) -> list[str]:
    """The lines of a page's ```bash blocks."""
    blocks = re.findall(r"^```bash\n(.*?)^```", page.read_text(), flags=re.M | re.S)
    return [line.strip() for block in blocks for line in block.splitlines() if line.strip()]


def readme_commands() -> list[str]:
    """Every command of the README and the manual, README first."""
    return [command for page in PAGES for command in page_commands(page)]


def snakemake_args(command: str) -> list[str]:
    """`.venv/bin/snakemake ARGS` -> ARGS (the tests run Snakemake with their own interpreter)."""
    words = shlex.split(command)
    assert words[0] == ".venv/bin/snakemake", command
    return words[1:]


def dry_run(command: str, wd: Path) -> None:
    """A long run, as a dry run: the DAG must build (every check passes) and hold jobs."""
    proc = run_snakemake(wd, *snakemake_args(command), "-n", "--quiet", "rules")
    assert job_counts(proc.stdout), proc.stdout[-2000:]


def offline_dry_run(command: str, wd: Path, tiny_run: Path) -> None:
    """`HF_HUB_OFFLINE=1 .venv/bin/snakemake ...`: the run on a machine without a network, as a dry run."""
    variable, _, rest = command.partition(" ")
    name, _, value = variable.partition("=")
    env = {**os.environ, name: value}
    proc = subprocess.run([*SNAKEMAKE, *snakemake_args(rest), "-n", "--quiet", "rules"], cwd=wd, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and job_counts(proc.stdout), proc.stdout[-2000:] + proc.stderr[-2000:]


def setup_and_run_and_report(command: str, wd: Path, tiny_run: Path) -> None:
    setup, run, report = (part.strip() for part in command.split("&&"))
    assert setup == "bash setup.sh"
    subprocess.run(["bash", "-n", str(REPO / "setup.sh")], check=True)  # it ran before these tests: CI's set-up
    dry_run(run, wd)  # the default experiment: 9 minutes, so a dry run
    done = tiny_run.parent / "report-run"
    shutil.copytree(tiny_run, done, symlinks=True)
    run_snakemake(done, *snakemake_args(report), "--configfile", str(TINY))
    assert (done / "results" / "report.html").stat().st_size > 100_000


def setup_and_test(command: str, wd: Path, tiny_run: Path) -> None:
    """The test command is what CI runs: `.ci/run` holds it word for word (this suite is its run)."""
    assert command in (REPO / ".ci" / "run").read_text()


def follow_logs(command: str, wd: Path, tiny_run: Path) -> None:
    """`tail -f` of the training logs: every pattern names logs a real run writes (the documented command
    is the default experiment's, in results/; the tiny run's are in results/tiny/)."""
    patterns = shlex.split(command)[2:]
    for pattern in patterns:
        found = glob.glob(str(tiny_run / pattern.replace("results/", "results/tiny/", 1)))
        assert found, f"{pattern} matches no log of the tiny run"
        assert any("] step " in Path(f).read_text() for f in found)


def profiling_cli(command: str, wd: Path, tiny_run: Path) -> None:
    words = shlex.split(command)
    assert words[0] == ".venv/bin/python"
    proc = subprocess.run([sys.executable, *words[1:]], cwd=wd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    out = wd / words[words.index("growlm.profiling") + 2]
    assert (out / "phases.csv").is_file() and (out / "summary.csv").is_file()


def snakedeploy(command: str, wd: Path, tiny_run: Path) -> None:
    """Deploy from a local copy instead of the URL (no network here); the deployed folder dry-runs."""
    words = shlex.split(command)
    src = copy_workflow(wd.parent / "growlm")
    dest = wd.parent / words[3]
    words = [str(Path(sys.executable).parent / "snakedeploy"), words[1], str(src), str(dest), *words[4:]]
    subprocess.run(words, check=True, capture_output=True, timeout=120)
    snakefile = dest / "workflow" / "Snakefile"
    snakefile.write_text(snakefile.read_text().replace('"workflow/Snakefile"', f'"{src / "workflow" / "Snakefile"}"'))
    proc = subprocess.run([*SNAKEMAKE, "-n", "--cores", "1", "--quiet", "rules"], cwd=dest, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0 and job_counts(proc.stdout), proc.stdout[-2000:] + proc.stderr[-2000:]


def babylm(command: str, wd: Path, tiny_run: Path) -> None:
    """BabyLM's files are a download: small files of the same names (one utterance a line) stand in."""
    import yaml

    overlay = yaml.safe_load((REPO / "config" / "babylm.yaml").read_text())
    for source in overlay["corpus"]["sources"]:
        path = wd / source["path"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(f"Utterance {i} of {source['name']} is here.\n" for i in range(50)))
    dry_run(command, wd)


def tensorboard(command: str, wd: Path, tiny_run: Path) -> None:
    """TensorBoard on the live curves: the tiny run's (it logs to TensorBoard), read by TensorBoard's
    own `--inspect`, which lists every run folder and its scalars instead of serving them."""
    words = shlex.split(command)
    logdir = words[words.index("--logdir") + 1]
    assert logdir == "results/live", command  # the default experiment's; the tiny run's is results/tiny/live
    live = tiny_run / "results" / "tiny" / "live"
    proc = subprocess.run([sys.executable, "-m", "tensorboard.main", "--inspect", "--logdir", str(live)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    for kind in ("small", "baseline", "refined"):
        assert f"{live}/{kind}/" in proc.stdout, proc.stdout[-3000:]
    assert "loss/val" in proc.stdout


HANDLERS = [
    (r"bash setup\.sh && \.venv/bin/snakemake --cores 2 && \.venv/bin/snakemake --report \S+", setup_and_run_and_report),
    (r"bash setup\.sh && \.venv/bin/python -m pytest .*", setup_and_test),
    (r"\.venv/bin/snakemake .*config/babylm\.yaml.*", babylm),
    (r"\.venv/bin/snakemake .*", lambda command, wd, tiny_run: dry_run(command, wd)),
    (r"HF_HUB_OFFLINE=1 \.venv/bin/snakemake .*", offline_dry_run),
    (r"tail -f .*", follow_logs),
    (r"\.venv/bin/tensorboard --logdir \S+", tensorboard),
    (r"\.venv/bin/python -m growlm\.profiling .*", profiling_cli),
    (r"\.venv/bin/snakedeploy deploy-workflow .*", snakedeploy),
]


def handler(command: str):
    for pattern, run in HANDLERS:
        if re.fullmatch(pattern, command):
            return run
    return None


def test_every_readme_command_has_a_way_to_run():
    commands = readme_commands()
    assert len(commands) >= 8, commands
    unhandled = [f"{page.relative_to(REPO)}: {c}" for page in PAGES for c in page_commands(page) if handler(c) is None]
    assert not unhandled, f"documented commands that no test runs: {unhandled}"


def test_the_readme_holds_the_two_commands_and_each_command_is_printed_once():
    """The README is the front door: the two commands for a fresh machine (set up and run, set up and
    test), nothing else to run; the manual's pages print every other command, none twice."""
    readme = page_commands(REPO / "README.md")
    assert [handler(c) for c in readme] == [setup_and_run_and_report, setup_and_test], readme
    commands = readme_commands()
    assert len(commands) == len(set(commands)), [c for c in commands if commands.count(c) > 1]


@pytest.mark.slow
@pytest.mark.parametrize("command", readme_commands())
def test_readme_command_runs(command, tiny_run, tmp_path):
    run = handler(command)
    assert run is not None, command
    run(command, copy_workflow(tmp_path / "wf"), tiny_run)
