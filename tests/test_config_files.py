"""A config file that would be read silently wrong (a key given twice: YAML and JSON keep the last) or not at all
(a tab: Snakemake says only "not valid JSON or YAML") stops the run before any job, naming the file and the line
(growlm.config_files): a --configfile overlay, checked by the workflow profile before Snakemake reads it and by the
Snakefile, and growlm's config/config.yaml, checked by the Snakefile before its `configfile:` reads it."""

from __future__ import annotations

import subprocess

import pytest

from conftest import REPO, SNAKEMAKE, TINY, run_snakemake

TWICE = "train:\n  small: {tokens: 12000, lr: 3.0e-3, batch_size: 8, warmup_steps: 5}\n  schedule: cosine\n  schedule: wsd\n"
TAB = "train:\n\tschedule: wsd\n"


def _refused(proc, line: str):
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and line in out, out[-3000:]
    assert "Building DAG" not in out  # stopped before planning any job
    return out


@pytest.mark.parametrize("text, line", [
    (TWICE, "over.yaml, line 4: train.schedule is given a second time (first on line 3); a config file's reader keeps "
            "the last without a word: keep one"),
    (TAB, "over.yaml, line 2, column 1: a tab, which YAML does not take where indentation goes: indent with spaces"),
    ('{"d0": [16],\n\t"d0": [8]}', "over.yaml: key 'd0' is given twice in one object"),  # JSON, which may hold tabs
])
def test_a_configfile_read_wrong_is_named_with_its_line(workflow_dir, text, line):
    (workflow_dir / "over.yaml").write_text(text)
    proc = run_snakemake(workflow_dir, "-n", "--cores", "1", "--configfile", str(TINY), "over.yaml", check=False)
    assert f"config error: {line}" in _refused(proc, line)


def test_a_configfile_with_a_tab_is_named_from_another_folder(workflow_dir, tmp_path):
    """Started elsewhere (-s growlm's Snakefile, --directory), the profile beside the Snakefile checks the files."""
    (tmp_path / "over.yaml").write_text(TAB)
    cmd = ["-s", str(workflow_dir / "workflow" / "Snakefile"), "--directory", str(tmp_path), "-n", "--cores", "1",
           "--configfile", str(workflow_dir / "config" / "config.yaml"), str(TINY), str(tmp_path / "over.yaml")]
    proc = subprocess.run([*SNAKEMAKE, *cmd], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    _refused(proc, f"{tmp_path / 'over.yaml'}, line 2, column 1: a tab")


@pytest.mark.parametrize("case", ["twice", "tab"])
def test_growlms_config_yaml_read_wrong_is_named(workflow_dir, case):
    config = workflow_dir / "config" / "config.yaml"
    lines = config.read_text().splitlines(keepends=True)
    if case == "twice":  # train's schedule given twice, on the lines after `train:`
        at = lines.index("train:\n") + 1
        lines[at:at] = ["  schedule: cosine\n", "  schedule: wsd\n"]
        line = f"config/config.yaml, line {at + 2}: train.schedule is given a second time (first on line {at + 1})"
    else:
        at = next(i for i, text in enumerate(lines) if text.startswith("seeds:"))
        lines[at] = "\t" + lines[at]
        line = f"config/config.yaml, line {at + 1}, column 1: a tab"
    config.write_text("".join(lines))
    _refused(run_snakemake(workflow_dir, "-n", "--cores", "1", check=False), f"config error: {line}")


def test_the_shipped_config_files_are_read_as_written():
    from growlm.config_files import config_file_problem

    files = [*REPO.glob("config/*.yaml"), *REPO.glob("tests/config/*.yaml"), *REPO.glob("bench/*.yaml")]
    assert files and [f"{f}: {config_file_problem(f)}" for f in files if config_file_problem(f)] == []


def test_the_snakefile_names_a_key_given_twice_without_the_profile(workflow_dir):
    """Without growlm's workflow profile (--workflow-profile none) the Snakefile still names the file and line."""
    (workflow_dir / "over.yaml").write_text(TWICE)
    proc = run_snakemake(workflow_dir, "-n", "--cores", "1", "--workflow-profile", "none", "--configfile", str(TINY),
                         "over.yaml", check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "over.yaml, line 4: train.schedule is given a second time" in out, out[-3000:]
