"""Known by content: what a run reads is known by its content, never by its file dates, and a run gives
one configuration wherever it starts.

- Members you bring (`members.pretrained`): weights changed with their old file date put back (as
  `cp -p`, `rsync -a` or `tar` leave them) rerun what reads them; a touch without a change reruns
  nothing; a change of member 2 reruns its import and the arms that use it, never the tokenizer, the
  token files, M_0 or an arm grown from member 1 alone.
- A damaged intermediate corpus file is named before any job, with the command that rebuilds it.
- Started from workflow/ instead of the root, a run stops at once saying where to run it; the schema's
  defaults are config.yaml's.
"""

from __future__ import annotations

import copy
import csv
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
import yaml

from collections import Counter

from conftest import REPO, SNAKEMAKE, TINY, copy_run, plan, planned_counts, run_output, run_snakemake
from test_pretrained import PRETRAINED, PRETRAINED_TARGETS, members, pretrained_overlay


def _put_back_with_old_dates(path: Path, data: bytes, stat: os.stat_result) -> None:
    path.write_bytes(data)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def _perturbed(path: Path) -> bytes:
    """The member's weights with one value changed (same size, still a valid safetensors file)."""
    from safetensors.numpy import load_file, save

    tensors = load_file(str(path))
    name = sorted(tensors)[0]
    tensors[name] = tensors[name].copy()
    tensors[name].flat[0] += 0.5
    return save(tensors, metadata={"format": "pt"})


@pytest.mark.slow
def test_members_are_known_by_content_not_by_date(pretrained_run, tmp_path):
    """Two Llama members of width 32 brought to the tiny experiment (M_1 of width 64, one arm of msg and one of
    concat): a copy of the shared run `pretrained_run` (tests/conftest.py; its members in its folder, named by
    relative paths), which went up to the report's first page (summary.rst, after the comparison) and the six
    token files, and every plan below asks for those (planned in this process, conftest's `plan`). What the
    run made of the members (their family, vocabulary and tokenizer, no member trained) is test_pretrained's;
    here, what the report says of them, and what reruns when they change."""
    wd = copy_run(pretrained_run, tmp_path / "wf")
    mine = [str(wd / m) for m in PRETRAINED]
    out = run_output(pretrained_run, 0).read_text()
    # the config's d0 (tiny.yaml: 16) gives way to the members' own width, said before any job
    assert ("growlm: warning: d0 = 16 of the config is overridden by the members' own shape (members.pretrained: "
            "width 32, 1 layer)") in out
    # the report describes the members as they are: their shape, where they came from, their cost not stated
    first_page = (wd / "results/tiny/report/summary.rst").read_text()
    assert "starts from 2 members trained elsewhere (llama, width 32, 1 layer;" in first_page, first_page
    assert f"{PRETRAINED[0]}; {PRETRAINED[1]}; saved in float32" in first_page
    assert "their cost not stated: ratios with the members free" in first_page
    rows = list(csv.DictReader(open(wd / "results/tiny/eval/comparison.csv")))
    assert {r["members_origin"] for r in rows} == {"trained elsewhere"} and all(r["wall_ratio"] == "" for r in rows)

    def would_run(*targets: str) -> Counter:
        return planned_counts(wd, configfiles=(TINY, "pre.yaml"), targets=targets or PRETRAINED_TARGETS)

    m1, m2 = Path(mine[0]) / "model.safetensors", Path(mine[1]) / "model.safetensors"
    original, stat1, original2 = m1.read_bytes(), m1.stat(), m2.read_bytes()
    assert would_run() == {}

    # touched, copied over itself: same content, new dates -> nothing to do
    for f in Path(mine[0]).iterdir():
        f.touch()
    shutil.copy(m2, m2.with_suffix(".tmp"))
    os.replace(m2.with_suffix(".tmp"), m2)
    assert would_run() == {}

    # member 1 changed, its old date put back (what `cp -p` of other weights does): rerun what reads it
    _put_back_with_old_dates(m1, _perturbed(m1), stat1)
    jobs = would_run()
    assert jobs.get("import_member") == 1 and jobs.get("refine") == 2, jobs
    assert not {"member_tokenizer", "encode_split", "train_baseline"} & set(jobs), jobs
    _put_back_with_old_dates(m1, original, stat1)  # and back as it was: nothing to do for it again (the next
    # plan would import member 1 again otherwise)

    # member 2 changed: its import and the concat arm only (msg grows from member 1 alone), never M_0
    m2.write_bytes(_perturbed(m2))
    jobs = would_run()
    assert jobs.get("import_member") == 1 and jobs.get("grow") == 1 and jobs.get("refine") == 1, jobs
    assert not {"member_tokenizer", "encode_split", "train_baseline"} & set(jobs), jobs
    grown = json.loads((wd / "results/tiny/models/grown/concat+zero_block/d32_L1_to_d64_L2/n2/s0/growth.json")
                       .read_text())
    assert [m["dir"] for m in grown["members"]] == ["results/tiny/models/pretrained/m1",
                                                     "results/tiny/models/pretrained/m2"]
    m2.write_bytes(original2)  # and back as it was, with a new date: nothing to do for it again (the next plan
    # would import member 2 again otherwise)

    def configure(items: list[str], extra: str = "") -> None:
        (wd / "pre.yaml").write_text(pretrained_overlay(items, extra))

    # member 1 linked from elsewhere, member 2 moved, their content the same: nothing is imported, grown or
    # trained again; only the comparison (which says where the members are) is made again
    linked, moved = wd / "linked_m1", wd / "moved" / "m2"
    linked.symlink_to(mine[0], target_is_directory=True)
    moved.parent.mkdir()
    shutil.move(mine[1], moved)
    configure([str(linked), str(moved)])
    jobs = would_run()
    assert "compare" in jobs and not {"import_member", "member_part", "member_tokenizer", "grow", "refine",
                                      "train_baseline"} & set(jobs), jobs
    # the members' stated cost: read by the comparison alone
    configure([str(linked), str(moved)], ", cost: {tokens: 50000}")
    jobs = would_run()
    assert "compare" in jobs and not {"import_member", "grow", "refine", "train_baseline"} & set(jobs), jobs

    # a new tokenizer.json (same vocabulary size) in both members: the experiment's tokenizer, every token
    # file, M_0 and every arm are made again in the run that reimports the members
    tok = json.loads((Path(mine[0]) / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    a, b = sorted(vocab, key=vocab.get)[200:202]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    for folder in (Path(mine[0]), moved):
        (folder / "tokenizer.json").write_text(json.dumps(tok))
    jobs = would_run()
    assert jobs.get("import_member") == 2 and jobs.get("member_tokenizer") == 1 and jobs.get("encode_split") == 6 \
        and jobs.get("train_baseline") == 1 and jobs.get("refine") == 2, jobs

    # both members replaced in place by GPT-2 members of another tokenizer: the run remakes the tokenizer, the
    # token files and M_0 like them (the baseline of every arm), not only the members' imports and the arms
    # (what such a run makes, GPT-2 models of the members' vocabulary, is test_offline's run of GPT-2 members)
    gpt2 = members(wd / "gpt2", "gpt2", d=32, vocab_book="pg14642_mcguffey_eclectic_primer.txt", vocab=350)
    for src, folder in zip(gpt2, (Path(mine[0]), moved)):
        shutil.rmtree(folder)
        shutil.copytree(src, folder)
    targets = ["results/tiny/models/baseline/d64_L2/t24000_lr0.003/s0/model.safetensors",
               "results/tiny/models/refined/msg/d32_L1_to_d64_L2/n2/t24000_lr0.003/s0/model.safetensors"]
    # (msg grows from member 1 alone: one import; both members' parts make the tokenizer; M_0 reads level 1's
    # train and val tokens)
    assert would_run(*targets) == {"member_part": 2, "member_tokenizer": 1, "encode_split": 2,
                                   "train_baseline": 1, "import_member": 1, "grow": 1, "refine": 1}


@pytest.mark.slow
def test_a_bundled_book_put_back_with_its_old_date_is_read_again(tiny_run, tmp_path):
    """Bundled books are known by their content, as your own files are: a book edited, prepared, then put
    back as it was with its old date (`cp -p`) is prepared again, and the corpus holds the original text."""
    wd = tmp_path / "wf"
    shutil.copytree(tiny_run, wd, symlinks=True)
    (wd / "workflow" / "resources").unlink()
    shutil.copytree(REPO / "workflow" / "resources", wd / "workflow" / "resources")
    name = "pg18735_little_red_hen.txt"
    book = wd / "workflow" / "resources" / "corpus" / name
    book.write_text(book.read_text().replace(" hen ", " zebraquark "))
    level = [f"results/tiny/corpus/level1/{split}.txt" for split in ("train", "val", "test")]
    args = ["--cores", "1", "--configfile", str(TINY)]

    def corpus() -> str:
        return "".join((wd / f).read_text() for f in level)

    run_snakemake(wd, *level, *args)
    assert "zebraquark" in corpus()
    subprocess.run(["cp", "-p", str(REPO / "workflow" / "resources" / "corpus" / name), str(book)], check=True)
    assert book.stat().st_mtime < (wd / level[0]).stat().st_mtime  # the original's date: older than the corpus
    error, jobs = plan(wd, configfiles=(TINY,), targets=level)  # in this process (conftest's `plan`)
    assert error is None and [rule for rule, _ in jobs].count("prepare_source") == 1, (error, jobs)
    run_snakemake(wd, *level, *args)
    assert "zebraquark" not in corpus() and " hen " in corpus()


@pytest.mark.slow
def test_a_book_edited_then_put_back_retrains_no_model_whose_tokens_came_out_the_same(tiny_run, tmp_path):
    """An edited level-1 book refits the tokenizer and re-encodes every level; level 0's tokens come out as they
    were (this edit changes no merge), and the run plans again after each encoding (rule encode_split is a
    checkpoint), so the members are not trained again. The book put back with its old date (`cp -p`) is
    re-encoded to the very tokens M_0 and the members were trained on: no model is trained again."""
    import hashlib

    wd = tmp_path / "wf"
    shutil.copytree(tiny_run, wd, symlinks=True)
    (wd / "workflow" / "resources").unlink()
    shutil.copytree(REPO / "workflow" / "resources", wd / "workflow" / "resources")
    name = "pg18735_little_red_hen.txt"  # level 1
    book = wd / "workflow" / "resources" / "corpus" / name
    book.write_text(book.read_text().replace("found a Seed", "found a small Seed", 1))
    models = [wd / f"results/tiny/models/small/d16_L1/s0/m{i}/model.safetensors" for i in (1, 2)]
    models.append(wd / "results/tiny/models/baseline/d32_L2/t24000_lr0.003/s0/model.safetensors")  # M_0: level 1
    made = {m: m.stat().st_mtime_ns for m in models}
    args = ["--cores", "1", "--configfile", str(TINY)]

    def tokens(level: int) -> str:  # its three splits'
        return hashlib.sha256(b"".join((wd / f"results/tiny/tokens/level{level}/{split}.npy").read_bytes()
                                       for split in ("train", "val", "test"))).hexdigest()

    before = tokens(0), tokens(1)
    level1 = [f"results/tiny/tokens/level1/{split}.npy" for split in ("train", "val", "test")]
    run_snakemake(wd, *[str(m.relative_to(wd)) for m in models[:2]], *level1, *args)  # targets first
    assert tokens(0) == before[0] and tokens(1) != before[1]  # level 0 as it was, level 1 re-encoded anew
    assert {m: m.stat().st_mtime_ns for m in models} == made  # no member trained again
    subprocess.run(["cp", "-p", str(REPO / "workflow" / "resources" / "corpus" / name), str(book)], check=True)
    run_snakemake(wd, *[str(m.relative_to(wd)) for m in models], *args)
    assert (tokens(0), tokens(1)) == before  # re-encoded as they were when the models were trained
    assert {m: m.stat().st_mtime_ns for m in models} == made  # so no model is trained again


def test_a_damaged_corpus_file_is_named_before_any_job(tiny_run, tmp_path):
    wd = tmp_path / "wf"
    shutil.copytree(tiny_run, wd, symlinks=True)
    text = wd / "results/tiny/corpus/level1/train.txt"
    assert Path(f"{text}.sha256").is_file()  # recorded by the job that wrote it
    with open(text, "r+b") as fh:
        fh.truncate(2000)
    proc = run_snakemake(wd, "-n", "--cores", "2", "--configfile", str(TINY), check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "Building DAG" not in out
    assert f"{text.relative_to(wd)} is damaged (its content differs from the sha256 recorded" in out
    assert "--force results/tiny/corpus/level1/train.txt" in out


def test_a_run_started_from_another_folder_stops_at_once(tmp_path):
    proc = subprocess.run([*SNAKEMAKE, "-n", "--cores", "1", "--configfile", str(TINY)], cwd=REPO / "workflow",
                          capture_output=True, text=True, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert f"growlm runs from the folder that holds config/ and workflow/ ({REPO})" in out
    assert f"cd {REPO}" in out and "Building DAG" not in out
    assert not (REPO / "workflow" / "results").exists()


def test_a_run_in_a_folder_of_its_own_names_growlms_config_first(tmp_path):
    """`--directory` elsewhere (as bench/savings.py runs) plans the same jobs as from the root when growlm's
    config.yaml is the first --configfile; an overlay alone there still stops at once."""
    def dry(cwd, *configs):
        cmd = [*SNAKEMAKE, "-s", str(REPO / "workflow" / "Snakefile"), "--directory", str(cwd), "-n", "--forceall", "--cores", "1",
               "--workflow-profile", "none", "--configfile", *map(str, configs)]
        return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=300)

    def jobs(out):  # the dry run's job table: "rule  count" lines between "Job stats:" and "total"
        table = out.split("Job stats:")[1].split("total")[0]
        return sorted(line.split()[0] + " " + line.split()[-1] for line in table.splitlines()[2:] if line.strip())

    elsewhere = dry(tmp_path, REPO / "config" / "config.yaml", TINY)
    at_root = dry(REPO, TINY)
    assert elsewhere.returncode == 0 and at_root.returncode == 0, elsewhere.stderr[-2000:]
    assert jobs(elsewhere.stdout + elsewhere.stderr) == jobs(at_root.stdout + at_root.stderr)
    alone = dry(tmp_path, TINY)
    assert alone.returncode != 0 and "name growlm's config first: --configfile" in alone.stdout + alone.stderr


def test_a_run_started_elsewhere_loads_growlms_workflow_profile(tmp_path):
    """Snakemake finds a workflow profile in the folder it starts in or beside the Snakefile: growlm's is
    profiles/default at the root, and workflow/profiles/default links to it, so that a run started in a folder
    of its own (`-s .../workflow/Snakefile --directory here`) loads the same profile (rerun-incomplete, the
    failed jobs' logs) as a run from the root. Here the run stops at its config check, after loading it."""
    cmd = [*SNAKEMAKE, "-s", str(REPO / "workflow" / "Snakefile"), "--directory", str(tmp_path), "-n", "--cores", "1",
           "--configfile", str(REPO / "config" / "config.yaml"), str(TINY), "--config", "experiment=models"]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    loaded = re.search(r"Using workflow specific profile (\S+) for setting default command line arguments", out)
    assert loaded, out[-2000:]
    assert Path(loaded.group(1)).resolve() == (REPO / "profiles" / "default").resolve()
    assert proc.returncode != 0 and "experiment = 'models'" in out  # and the run went on to its config check


def test_the_schema_defaults_are_config_yaml_s():
    """Every value the schema fills in when a key is missing is the one config/config.yaml gives, so an
    overlay means the same on top of either."""
    from snakemake.utils import validate

    cfg = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    required = {k: copy.deepcopy(cfg[k]) for k in ("d0", "L0", "d1", "L1", "n", "methods", "seeds")}
    filled = {**required, "corpus": {"sources": cfg["corpus"]["sources"]}, "train": {stage: copy.deepcopy(cfg["train"][stage]) for stage in ("small", "large")}}  # required: no defaults
    validate(filled, str(REPO / "workflow" / "schemas" / "config.schema.yaml"))
    differ = []

    def walk(ours, theirs, path):
        if isinstance(ours, dict) and isinstance(theirs, dict):
            for k in ours.keys() & theirs.keys():
                walk(ours[k], theirs[k], f"{path}.{k}")
        elif ours != theirs:
            differ.append(f"{path}: config.yaml {ours!r}, schema default {theirs!r}")

    walk(cfg, filled, "")
    assert not differ, differ


def test_reordering_methods_reruns_nothing_and_adding_one_names_nothing_gone(tiny_run, tmp_path, capsys):
    """Planned in this process (conftest's `plan`: what the Snakefile prints is captured)."""
    wd = tmp_path / "wf"
    shutil.copytree(tiny_run, wd, symlinks=True)
    methods = yaml.safe_load(TINY.read_text())["methods"]
    flipped = json.dumps(methods[::-1]).replace('"', "")
    assert plan(wd, f"methods={flipped}", configfiles=(TINY,)) == (None, [])
    added = json.dumps([*methods, "msg"]).replace('"', "")
    capsys.readouterr()
    error, jobs = plan(wd, f"methods={added}", configfiles=(TINY,))
    said = capsys.readouterr().err
    assert error is None and "refine" in [rule for rule, _ in jobs], (error, jobs)
    assert "are gone" not in said, said[-2000:]


def test_a_printed_command_runs_as_printed(monkeypatch):
    """A hint printed under a command that ran no job (`--report`, a dry run) still has cores to run with."""
    from snakemake.cli import get_argument_parser

    from growlm import hints

    options = hints.option_table(get_argument_parser())
    for argv in (["snakemake", "--report", "r.html", "--configfile", "my.yaml"], ["snakemake", "-n"]):
        monkeypatch.setenv(hints.COMMAND_ENV, json.dumps(hints.split_command(argv, options)))
        assert hints.again().startswith("snakemake --cores all")
    argv = ["snakemake", "--cores", "2", "--configfile", "my.yaml"]
    monkeypatch.setenv(hints.COMMAND_ENV, json.dumps(hints.split_command(argv, options)))
    assert hints.again() == "snakemake --cores 2 --configfile my.yaml"


@pytest.mark.parametrize("error", [OSError(28, "No space left on device", "results/x/model.safetensors"),
                                   RuntimeError("SafetensorError: Error while serializing: IoError(Os { code: 28, "
                                                "kind: StorageFull, message: \"No space left on device\" }) (os error 28)")])
def test_a_full_disk_is_one_line_naming_the_cause(tmp_path, capfd, error):
    from growlm.errors import job_log

    with pytest.raises(SystemExit) as stop:
        with job_log(tmp_path / "job.log", "train_small"):
            raise error
    assert stop.value.code == 1
    line = capfd.readouterr().err.strip()
    assert len(line.splitlines()) == 1 and line.startswith("growlm train_small: error: no space left on the disk")
    assert "run the workflow again: finished jobs stay" in line
    assert "Traceback" in (tmp_path / "job.log").read_text()  # the details stay in the job's log


def test_every_saved_model_is_a_transformers_folder(tiny_run):
    """Members, M_0, every grown M'_1 (masked or plain) and every M_1 load with AutoModelForCausalLM and
    AutoTokenizer; a masked M'_1's folder holds the model it becomes once its ramps are done."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from growlm.growth import load_grown

    folders = sorted({p.parent for p in (tiny_run / "results/tiny/models").rglob("config.json")})
    grown = [f for f in folders if "/grown/" in str(f)]
    assert len(grown) >= 3 and any((f / "growlm_grown.json").is_file() for f in grown)
    for folder in folders:
        model = AutoModelForCausalLM.from_pretrained(folder)
        assert AutoTokenizer.from_pretrained(folder).vocab_size > 0
        if (folder / "growlm_grown.json").is_file():  # the inner model of the masked one growlm loads
            masked = load_grown(folder)
            assert all(torch.equal(a, b) for a, b in zip(masked.inner.state_dict().values(),
                                                          model.state_dict().values()))


def test_jobs_run_the_library_of_their_workflow(workflow_dir, tmp_path, monkeypatch):
    """Another growlm first on the path (an installed copy of another checkout; here on PYTHONPATH, ahead
    of even site-packages): the workflow's jobs still run the workflow's own library, as its checks did."""
    other = tmp_path / "other"
    shutil.copytree(REPO / "workflow" / "scripts" / "growlm", other / "growlm",
                    ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setenv("PYTHONPATH", str(other))
    target = "results/tiny/corpus/sources/pg18735_little_red_hen/source.json"
    run_snakemake(workflow_dir, target, "--cores", "1", "--configfile", str(TINY))
    log = (workflow_dir / "results/tiny/logs/prepare_source/pg18735_little_red_hen.log").read_text()
    assert log.splitlines()[0] == f"growlm prepare_source: library {workflow_dir / 'workflow/scripts/growlm'}", log


def test_a_job_that_runs_another_growlm_stops_naming_both(tmp_path, monkeypatch, capfd):
    from growlm.errors import job_log

    monkeypatch.setenv("GROWLM_LIBRARY", str(tmp_path / "elsewhere" / "growlm"))
    with pytest.raises(SystemExit) as stop:
        with job_log(tmp_path / "job.log", "grow"):
            raise AssertionError("the job ran")
    line = capfd.readouterr().err.strip()
    assert stop.value.code == 1 and len(line.splitlines()) == 1
    assert line.startswith(f"growlm grow: error: this job imported growlm from {REPO / 'workflow/scripts/growlm'}, "
                           f"but its workflow's library is {tmp_path / 'elsewhere' / 'growlm'}")
