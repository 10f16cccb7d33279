"""The Snakemake catalogue's way of using a workflow: `snakedeploy deploy-workflow` into an empty folder
of one's own, which then runs growlm as a Snakemake module (the rules, scripts, library and bundled
books stay in the source), with the conda environment that every rule names."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

from conftest import REPO, copy_workflow, job_counts, run_snakemake

SNAKEDEPLOY = Path(sys.executable).parent / "snakedeploy"


def test_snakedeploy_deploys_a_workflow_that_runs(tmp_path):
    src = copy_workflow(tmp_path / "growlm")
    dest = tmp_path / "my-experiment"
    proc = subprocess.run([str(SNAKEDEPLOY), "deploy-workflow", str(src), str(dest), "--branch", "main"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (dest / "config" / "config.yaml").read_text() == (REPO / "config" / "config.yaml").read_text()
    assert (dest / "config" / "README.md").is_file() and (dest / "profiles" / "slurm" / "config.yaml").is_file()
    snakefile = dest / "workflow" / "Snakefile"
    text = snakefile.read_text()
    assert re.search(r"^module \w+:", text, flags=re.M) and "use rule * from" in text
    # snakedeploy 0.17.1 writes a local source as "workflow/Snakefile", which Snakemake resolves
    # against the new Snakefile's own folder; point it at the source (docs/architecture.md says so)
    assert '"workflow/Snakefile"' in text
    snakefile.write_text(text.replace('"workflow/Snakefile"', f'"{src / "workflow" / "Snakefile"}"'))
    counts = job_counts(run_snakemake(dest, "-n", "--cores", "1", "--quiet", "rules").stdout)
    assert counts["train_small"] == 2 and counts["refine"] == 2 and counts["prepare_source"] == 27
    # a real job: the bundled books are found in the source, and the rule's script imports the
    # library that lies beside it, not an installed copy
    hide = tmp_path / "hide_installed"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text(
        "import sys\nsys.path[:] = [p for p in sys.path if not p.endswith('workflow/scripts')]\n")
    env = {**os.environ, "PYTHONPATH": str(hide)}
    book = "pg14642_mcguffey_eclectic_primer"  # one bundled book's preparation
    proc = subprocess.run([sys.executable, "-m", "snakemake", "--cores", "1", f"results/corpus/sources/{book}/source.json"],
                          cwd=dest, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    log = (dest / "results" / "logs" / "prepare_source" / f"{book}.log").read_text()
    assert f"library {src / 'workflow' / 'scripts' / 'growlm'}" in log, log[:500]


def test_the_conda_environment_holds_the_dependencies_and_not_the_package():
    """`workflow/envs/growlm.yaml` pins exactly pyproject's dependencies and installs nothing from a
    path (Snakemake copies the file elsewhere before building it; the rules import the library from
    beside their scripts instead). Building it needs conda, which this test does not assume."""
    import tomllib

    env = yaml.safe_load((REPO / "workflow" / "envs" / "growlm.yaml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    ignored = ("snakemake", "snakemake-executor-plugin-slurm")  # Snakemake itself runs outside the env
    assert sorted(pip) == sorted(d for d in project if d.split("[")[0].split("=")[0] not in ignored)
    assert not [p for p in pip if p.startswith("-") or "/" in p or p.startswith(".")]
