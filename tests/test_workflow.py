"""The Snakemake workflow: plans (in this process, conftest's `plan`) and dry runs, sweeps that rerun only what
changed, bad config, lint, a real run."""

from __future__ import annotations

import csv
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import REPO, SNAKEMAKE, TINY, check_profile_tables, plan, planned_counts, run_snakemake


def test_default_config_dry_run(workflow_dir):
    counts = planned_counts(workflow_dir)
    assert counts["train_small"] == 2  # n = 2 members
    assert counts["train_baseline"] == 1
    assert counts["grow"] == counts["refine"] == 2  # msg and concat (controls.single_member is off)
    assert counts["build_level"] == 2  # levels 0 and 1
    assert counts["fit_tokenizer"] == 1
    assert counts["evaluate_model"] == 5  # 2 members, M_0, the two M_1
    assert counts["evaluate_ensemble"] == 1


def test_sweep_on_the_command_line_makes_one_target_per_combination(workflow_dir):
    counts = planned_counts(workflow_dir, "n_members=[2,3]", "d0=[32,64]", "d1=192", "methods=[msg,[concat,lemon]]")
    assert counts["train_small"] == 2 * 3  # members m1..m3 for each d0, shared across n
    assert counts["grow"] == counts["refine"] == 2 * 2 * 2  # (d0, n) x (msg, concat+lemon)
    assert counts["train_baseline"] == 1


@pytest.mark.parametrize(
    "override, message",
    [
        (["dd0=64"], "dd0: unknown key; did you mean 'd0'?"),
        (["d0=0"], "d0 = 0:"),
        (["d0=128", "d1=64"], "d1 = 64: smaller than d0 = 128"),
        (["methods=[no_such_method]"], "unknown growth method 'no_such_method'"),
        (["L0=8"], "L1 = 4: smaller than L0 = 8"),
        # the old sweep example of the docs (docs/configuration.md): concat cannot put 3 members of width 32 or 64 side by side in 128
        (["d0=[32,64]", "n_members=3"], "concat with d0 = 64, L0 = 4, n = 3 -> d1 = 128, L1 = 4: concat: concat of 3 "
                                        "members of width 64 needs width >= 192, not 128; d1 = 192 would work"),
        (["d1=40", "methods=[[hyperclone,zero_block]]"], "d1 = 40: not a multiple of model.head_dim = 16"),
        (["methods=[hyperclone]", "d1=160"], "hyperclone needs the width 160 to be a multiple of the source width 64 "
                                             "(k = d1/d0 must be an integer); use 'lemon' for other widths; d1 = 192 "
                                             "would work"),
        (["grow={options: {msg: {ramp_stepz: 9}}}"], "option(s) ramp_stepz not taken by msg; they take: msg: "
                                                     "ramp_steps, position, init_std"),
        (["grow={options: {msg: {ramp_steps: 99999}}}"], "longer than the shortest refinement"),
        (["train={refine: {tokens: 5}}"], "train.refine.tokens: unknown key"),
        (["grow={optimizer_state: carry}"], "grow.optimizer_state: removed: the carry-over of the members' AdamW "
                                            "moments is the `carry` refinement operator now"),
        (["model={head_dim: abc}"], "model.head_dim = 'abc'"),
        # the schema takes any family name; the check names the families growlm has
        (["model={family: lama}"], "model.family = 'lama': not a model family growlm has; one of gpt2, llama "
                                   "(did you mean 'llama'?)"),
        (["model={heads_per_kv: 2}"], "model.heads_per_kv = 2: a setting of the llama family; gpt2 has"),
        (["members={data: shard}"], "members.data = 'shard': not allowed; expected one of seed, shards, clusters"),
        (["members={data: clusters, shards: 9}"], "members.data = clusters: 9 clusters of whole books"),
        (["methods=[[teach]]"], "has only refinement operators (teach)"),
        (["methods=[[msg, teach]]", "grow={options: {teach: {temprature: 3}}}"], "option(s) temprature not taken by "
                                                                                 "msg+teach"),
        (["methods=[msg_members]", "n_members=3"], "msg_members places m_2..m_3 beside m_1 in the new capacity"),
        (["grow={plugins: [nowhere.py]}"], "grow.plugins: nowhere.py does not exist"),
        (["train={compile: fast}"], "train.compile = 'fast': not allowed; expected boolean or one of default, "
                                    "reduce-overhead"),
        # values read as the numbers they are, every alternative named
        (["budgets=[0]"], "budgets = [0]: not allowed; expected integer >= 1 or a list of (integer >= 1)"),
        (["train={small: {tokens: -5}}"], "train.small.tokens = -5: not allowed; expected integer >= 1 or 'gstack'; "),
        (["train={final_eval_tokens: -1}"], "train.final_eval_tokens = -1: not allowed; expected integer >= 0"),
        # a job across nodes needs SLURM: the dry run of a local run says so (through profiles/slurm it plans)
        (["resources={nodes: 2}"], "resources.nodes = 2: a training job across several nodes runs through SLURM "
                                   "(--profile profiles/slurm: one allocation of 2 nodes, a torchrun agent started on "
                                   "each), and this run uses Snakemake's local executor"),
        # a name's rule is a pattern: said, not "expected string"
        (["experiment=my run"], "experiment = 'my run': not allowed; expected a string matching the pattern "
                                "^[A-Za-z0-9][A-Za-z0-9_-]*$; the experiment's name, letters, digits, _ and - "
                                "beginning with a letter or a digit"),
        # Snakemake drops a YAML tag from a --config value: said in one line, not run with what is left (here a
        # list where the family's name goes, which stopped the config check with a TypeError)
        (["model={family: !!python/object/apply:os.system [id]}"],
         "config error: --config 'model={family: !!python/object/apply:os.system [id]}': !!python/object/apply:os.system "
         "is a YAML tag, which --config does not read (Snakemake drops it and keeps what follows); give model its "
         "value itself, without a tag"),
    ],
)
def test_bad_config_is_named(workflow_dir, override, message):
    """Every problem is found while the Snakefile is parsed, before any job, and named: here in this process
    (conftest's `plan`); what the terminal shows, in `test_a_bad_config_is_one_message_in_the_terminal`."""
    if override[0].startswith(("resources={nodes", "model={family: !!")):  # the command line's: a real dry run
        proc = run_snakemake(workflow_dir, "-n", "--cores", "1", "--config", *override, check=False)
        text = proc.stdout + proc.stderr
        assert proc.returncode != 0 and "Traceback (most recent call last)" not in text
    else:
        text, _ = plan(workflow_dir, *override)
        assert text is not None and text.startswith("config error: "), text
    assert message in text, text[-3000:]


@pytest.mark.parametrize("override, message", [
    (["dd0=64"], "dd0: unknown key; did you mean 'd0'?"),  # the schema's check
    (["d1=40", "methods=[[hyperclone,zero_block]]"], "d1 = 40: not a multiple of model.head_dim = 16"),  # growlm's
])
def test_a_bad_config_is_one_message_in_the_terminal(workflow_dir, override, message):
    """`snakemake -n` with a bad value stops, naming it, without a traceback."""
    proc = run_snakemake(workflow_dir, "-n", "--cores", "1", "--config", *override, check=False)
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert message in text, text[-3000:]
    assert "Traceback (most recent call last)" not in text


@pytest.mark.parametrize("override, path", [
    (["budgets=1e6"], "t1000000_lr0.0012"),  # a whole number written as a float is that number
    (["d0=64.0", "budgets=[1.2e6]"], "d64_L4/s0/m1"),
    (["model={head_dim: 32}"], "d128_L4"),  # nested values are read as YAML, as in a config file
    (["train={small: {lr: 3e-3, batch_size: 8}}", "resources={memory_limit_gb: 2.5}"], "d64_L4"),
    (["experiment=nan"], "results/nan/models/"),  # a name that reads as a number (nan, 2024) is the text written
])
def test_command_line_values_are_read_as_their_types(workflow_dir, override, path):
    error, jobs = plan(workflow_dir, *override)
    assert error is None, error
    text = "\n".join(sorted(f for _, outputs in jobs for f in outputs))
    assert path in text and ".0_" not in text and "1000000.0" not in text


def test_a_name_that_reads_as_a_number_is_its_text_and_a_yaml_tag_is_found_wherever_a_value_starts():
    """Snakemake reads `--config experiment=nan` as a float and `2024` as an integer: where the schema wants
    a string, that is the text the user wrote. A tag starts a value, an item of a list, or a mapping's
    value; quoting the whole value does not hide it (Snakemake strips the quotes)."""
    from growlm.config_values import coerce, config_tag_problems

    schema = {"type": "object", "properties": {"experiment": {"type": "string"}, "d0": {"type": "integer"}}}
    assert coerce({"experiment": 2024, "d0": 32.0}, schema, {}) == {"experiment": "2024", "d0": 32}
    assert coerce({"experiment": float("nan")}, schema, {})["experiment"] == "nan"
    assert coerce({"experiment": True}, schema, {})["experiment"] is True  # not a number: the schema names it
    plain = ["snakemake", "-n", "--config", "experiment=wow!", "d0=[32, 64]", "grow={options: {msg: {a: b}}}"]
    assert config_tag_problems(plain) == []
    for value in ("!!python/name:os.system", "[msg, !!python/tuple [x]]", "{family: !llama x}", "'!!str x'"):
        (problem,) = config_tag_problems(["snakemake", "--config", "experiment=a", f"methods={value}", "-n"])
        assert problem.startswith(f"--config {'methods=' + value!r}: !") and "give methods its value" in problem
    assert config_tag_problems(["snakemake", "--config=methods=!!python/tuple [x]"])  # the option's inline form


def test_members_no_method_reads_are_said_before_the_jobs(workflow_dir, capsys):
    """msg grows from m_1 alone: n = 40 would train and evaluate 40 members (for the members' ensemble only),
    said in one line before Snakemake plans a job (a real dry run: the terminal's order); with a method that
    combines members (the tiny config's), nothing is said while the Snakefile is parsed (conftest's `plan`)."""
    out = subprocess.run([*SNAKEMAKE, "-n", "--cores", "1", "--configfile", str(TINY), "--config", "methods=[msg]",
                          "n_members=40"], cwd=workflow_dir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, timeout=600).stdout  # one stream: the line comes before the plan
    line = ("growlm: warning: n = 40: no method of the sweep reads more than 1 member (msg reads m_1 alone), yet all 40 "
            "are trained and evaluated (40 trainings); the other 39 serve only the members' ensemble "
            "(controls.ensemble). n: [1] trains what the methods read")
    assert line in out and out.index(line) < out.index("Building DAG of jobs"), out[-3000:]
    capsys.readouterr()
    assert planned_counts(workflow_dir, configfiles=(TINY,))["train_small"] == 2
    combined = capsys.readouterr()
    assert "no method of the sweep reads" not in combined.out + combined.err


def test_missing_source_file_is_named(workflow_dir):
    """Without the bundled corpus the plan stops, naming the file it misses (conftest's `plan`)."""
    (workflow_dir / "workflow" / "resources").unlink()
    (workflow_dir / "workflow" / "resources").mkdir()
    error, jobs = plan(workflow_dir)
    assert error is not None and not jobs
    assert "resources/corpus/pg" in error, error


def test_lint_is_clean(workflow_dir):
    proc = run_snakemake(workflow_dir, "--lint", check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_rules_are_formatted_with_snakefmt():
    """`snakefmt --check` as the Snakemake catalogue runs it (settings in pyproject.toml)."""
    import subprocess
    import sys
    from pathlib import Path

    snakefmt = Path(sys.executable).parent / "snakefmt"
    proc = subprocess.run([str(snakefmt), "--check", "workflow"], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_python_has_no_unused_names_or_syntax_errors():
    """ruff's pyflakes checks (unused imports and variables, undefined names) over the library,
    the entry scripts, the tests and the benchmarks."""
    import subprocess
    import sys
    from pathlib import Path

    ruff = Path(sys.executable).parent / "ruff"
    proc = subprocess.run([str(ruff), "check", "--select", "F,E9", "--line-length", "120", "--output-format",
                           "concise", "workflow/scripts", "tests", "bench"], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.slow
def test_tiny_run_makes_the_report(tiny_run):
    comparison = list(csv.DictReader(open(tiny_run / "results/tiny/eval/comparison.csv")))
    # hyperclone+zero_block, concat+zero_block and concat's single-member control (hyperclone is
    # single-source: its control would repeat it)
    assert sorted(r["method"] for r in comparison) == ["concat+zero_block", "concat+zero_block@m1",
                                                       "hyperclone+zero_block"]
    row = comparison[0]
    assert float(row["ensemble_test_loss"]) > 0
    assert float(row["m0_final_val_loss"]) < float(row["unigram_test_loss"])
    assert float(row["small_flops"]) > 0 and float(row["m0_flops"]) > 0
    assert {r["members_schedule"] for r in comparison} == {"cosine"}  # read from the members, as M_0's and M_1's
    report = (tiny_run / "results/tiny/report.html").read_text(errors="replace")
    assert "comparison.html" in report and "loss_vs_flops.svg" in report
    for path in ["results/tiny/report/comparison.html", "results/tiny/report/loss_vs_flops.svg",
                 "results/tiny/report/corpus_stats.html"]:
        assert (tiny_run / path).stat().st_size > 500


def test_the_report_of_an_unfinished_run_says_to_finish_it_first(workflow_dir):
    """Snakemake would stop at the first figure marked for the report that is not made yet ("marked for report
    but does not exist"): growlm says in one line that the run is not finished, with the command that finishes it."""
    proc = run_snakemake(workflow_dir, "--cores", "1", "--configfile", str(TINY), "--report", "r.html", check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "marked for report but does not exist" not in out, out[-3000:]
    assert re.search(r"the report describes a finished run, and this one is not finished \(\d+ of its outputs are "
                     r"not made yet, such as results/tiny/\S+\): finish it with `\S+ -m snakemake --cores 1 "
                     r"--configfile \S+tiny.yaml`, then build the report", out), out[-3000:]
    assert not (workflow_dir / "r.html").exists()


def test_a_finished_run_is_complete_and_a_moved_copy_reruns_nothing(tiny_run, tmp_path):
    """A finished run plans no job; nor does a copy of the project in another folder (inputs are
    recorded relative to the working directory, so moving a project keeps every result). Planned in this
    process (conftest's `plan`, with the default profile's rerun triggers); the terminal's "Nothing to be
    done" is test_a_clone_with_the_results_copied_in_reruns_nothing's real dry run."""
    assert plan(tiny_run, configfiles=(TINY,)) == (None, [])
    moved = tmp_path / "moved"
    shutil.copytree(tiny_run, moved, symlinks=True)
    assert plan(moved, configfiles=(TINY,)) == (None, [])


def test_a_clone_with_the_results_copied_in_reruns_nothing(tiny_run, tmp_path):
    """A fresh clone has fresh file dates on every script; with a finished run's results/ and .snakemake/ copied in
    (dates kept), nothing reruns: Snakemake's code trigger (a script's date against its outputs') is left out
    (profiles/default), and what a job reads - params and inputs - is the same."""
    clone = tmp_path / "clone"
    shutil.copytree(tiny_run, clone, symlinks=True)
    for folder, _, files in os.walk(clone / "workflow"):  # not into the linked corpus (os.walk follows no link)
        for name in files:
            if not (Path(folder) / name).is_symlink():
                (Path(folder) / name).touch()  # as a checkout writes them
    out = run_snakemake(clone, "-n", "--cores", "1", "--configfile", str(TINY)).stdout
    assert "Nothing to be done" in out, out[-3000:]


@pytest.mark.slow
def test_tiny_run_profiles_every_model_kind_and_reports_it(tiny_run):
    """The profiling rules on a machine without a GPU: nsys runs itself where it is installed (NVTX
    ranges only), else falls back to torch.profiler (CPU) and says why (ncu's fallback: the GPU
    recipe's run, tests/test_gpu_recipe.py). Every table names the profiler that made it, and the
    report has the Profile section."""
    import json

    report_html = (tiny_run / "results/tiny/report/profile.html").read_text()
    assert "<h3>Profile</h3>" in report_html and 'id="profile-cost"' in report_html
    for kind in ("small", "baseline", "refine"):
        folder = tiny_run / "results/tiny/profile/nsys" / kind
        found = json.loads((folder / "tools.json").read_text())  # what the job detected
        assert found["cuda"] is False
        made_by = "nsys" if found["nsys"]["works"] else "torch-cpu"
        check_profile_tables(folder, "nsys", made_by)
        assert f"{kind}: requested nsys, tables made by <code>{made_by}</code>" in report_html
    assert not (tiny_run / "results/tiny/profile/ncu").exists()  # only the tools asked for
    assert "profile.html" in (tiny_run / "results/tiny/report.html").read_text(errors="replace")


@pytest.mark.slow
def test_adding_a_member_reruns_only_what_it_touches(tiny_run, tmp_path):
    # concat puts the members side by side: three of width 16 cannot make width 32, and the check
    # says so before any job runs. LiGO combines any number of members, so the sweep uses it.
    # (planned in this process: conftest's `plan`)
    refused, _ = plan(tiny_run, "n_members=[2,3]", configfiles=(TINY,))
    assert refused is not None
    assert "concat of 3 members of width 16 needs width >= 48, not 32; d1 = 48 would work" in refused, refused
    overlay = tmp_path / "ligo.yaml"
    overlay.write_text("methods:\n  - [hyperclone, zero_block]\n  - [ligo, zero_block]\n")

    def planned(n):
        return planned_counts(tiny_run, f"n_members={n}", configfiles=(TINY, overlay))

    before, after = planned("[2]"), planned("[2,3]")
    added = {rule: after.get(rule, 0) - before.get(rule, 0) for rule in after}
    assert {rule: k for rule, k in added.items() if k} == {
        "train_small": 1,  # only m3
        # at n=3: ligo, its m_1-only control, hyperclone (single-source, so no control of its own)
        "grow": 3, "refine": 3,
        "evaluate_model": 4,  # m3 and the three new M_1
        "evaluate_ensemble": 1,
    }, (before, after)
    assert not {"train_baseline", "fit_tokenizer", "build_level"} & set(after)


@pytest.mark.slow
@pytest.mark.parametrize("change, reruns, keeps", [
    ("train: {small: {tokens: 14000}}", {"train_small", "grow", "refine"}, {"train_baseline"}),
    # the refinement inherits M_0's batch size; growth does not read it (its ramps are the refinement's)
    ("train: {large: {batch_size: 4}}", {"train_baseline", "refine"}, {"train_small", "grow"}),
    # the refinement's warm-up is train.refine's: M_0's own warm-up does not touch it
    ("train: {large: {warmup_steps: 4}}", {"train_baseline"}, {"train_small", "grow", "refine"}),
    ("train: {refine: {warmup_steps: 2}}", {"refine"}, {"train_small", "train_baseline", "grow"}),
    # under wsd a member's job keeps one model more (where its decay began): it reruns all the same, whatever
    # members.source reads (Snakemake compares no params of a job with an output it has no record of)
    ("train: {schedule: wsd}", {"train_small", "train_baseline", "grow", "refine", "compare"}, set()),
    ("train: {small: {schedule: wsd}}", {"train_small", "grow", "refine", "compare"}, {"train_baseline"}),
])
def test_a_training_setting_reruns_only_the_jobs_that_read_it(tiny_run, tmp_path, change, reruns, keeps):
    overlay = tmp_path / "change.yaml"
    overlay.write_text(change + "\n")
    counts = planned_counts(tiny_run, configfiles=(TINY, overlay))  # conftest's `plan`, in this process
    assert reruns <= set(counts), (change, counts)
    assert not keeps & set(counts), (change, counts)


@pytest.mark.slow
def test_grown_model_preserves_the_member_before_training(tiny_run):
    """M'_1's validation loss at step 0 (ledger) equals member m_1's loss on the same data."""
    import torch

    from growlm.growth import load_grown
    from growlm.model import load_model

    member = load_model(tiny_run / "results/tiny/models/small/d16_L1/s0/m1")
    grown_dir = tiny_run / "results/tiny/models/grown/hyperclone+zero_block/d16_L1_to_d32_L2/n2/s0"
    grown = load_grown(grown_dir)
    x = torch.randint(0, member.config.vocab_size, (2, 32))
    with torch.no_grad():
        diff = (grown(input_ids=x).logits - member(input_ids=x).logits).abs().max().item()
    assert diff < 1e-4

    # concat of both members: M'_1 is exactly their logit-average ensemble before training
    from growlm.model import LogitEnsemble

    second = load_model(tiny_run / "results/tiny/models/small/d16_L1/s0/m2")
    concat = load_grown(tiny_run / "results/tiny/models/grown/concat+zero_block/d16_L1_to_d32_L2/n2/s0")
    with torch.no_grad():
        ens = LogitEnsemble([member, second])(input_ids=x).logits
        diff = (concat(input_ids=x).logits - ens).abs().max().item()
    assert diff < 1e-4


def test_dry_run_over_every_registered_method(workflow_dir):
    """Every operator of growlm.methods.OPERATORS (in a chain reaching d1, L1) and the V-cycle plan."""
    from growlm.methods import OPERATORS

    from growlm.methods import needs_single_member_control, schedules

    chains = []
    for name, op in sorted(OPERATORS.items()):
        if op.axis == "schedule":  # stands alone, added below
            continue
        if op.axis == "refine":  # teach, freeze, carry ride on a growth operator
            chains.append(f"[msg,{name}]")
        elif name == "merge":  # keeps the width: merge, then grow
            chains.append("[merge,msg]")
        elif op.axis == "width":
            chains.append(f"[{name},zero_block]")
        elif op.axis == "depth":
            chains.append(f"[hyperclone,{name}]")
        else:
            chains.append(name)
    chains = sorted(set(chains)) + schedules()  # hyperclone and zero_block give the same chain
    counts = planned_counts(workflow_dir, f"methods=[{','.join(chains)}]", "L0=2", "L1=4",
                            "controls={single_member: true}")
    n_chains = len(chains) - len(schedules())
    assert n_chains == len(OPERATORS) - len(schedules()) - 1
    # the multi-member chains (concat, stack_members, ligo, mango, msg_members, merge, teach) add a
    # single-member control each
    multi = [c for c in chains if needs_single_member_control(c.strip("[]").split(","))]
    assert len(multi) == 7
    assert counts["grow"] == n_chains + len(multi) + 2  # + the two schedules
    assert counts["refine"] == n_chains + len(multi) + 2


@pytest.mark.slow
def test_optimizer_state_carry_over_in_the_workflow(tiny_run, tmp_path):
    """`carry` in the chain grows the members' AdamW moments and the refinement starts from them."""
    import json
    import shutil

    wd = tmp_path / "wf"
    shutil.copytree(tiny_run, wd, symlinks=True)
    target = ("results/tiny/models/refined/concat+zero_block+carry/d16_L1_to_d32_L2/n2/t24000_lr0.003/s0/"
              "model.safetensors")
    run_snakemake(wd, "--cores", "1", target, "--configfile", str(TINY), "--config",
                  'methods=[["concat", "zero_block", "carry"]]')
    growth = json.loads((wd / "results/tiny/models/grown/concat+zero_block+carry/d16_L1_to_d32_L2/n2/s0/"
                               "growth.json").read_text())
    assert growth["moments_step"] > 0 and growth["moments"]
    log = (wd / "results/tiny/logs/refine/concat+zero_block+carry_d16_L1_to_d32_L2_n2_t24000_lr0.003_s0.log").read_text()
    assert "AdamW starts from carried-over moments" in log
