"""Benchmark tasks of lm-evaluation-harness (`evaluate.tasks`): checked before any job, run on every
model of the tiny experiment, and found in the comparison, `eval/tasks.csv` and the report; a task
that fails is recorded, not raised."""

from __future__ import annotations

import json
import shutil

import pandas as pd
import pytest

from conftest import TINY, job_counts, run_snakemake
from growlm import tasks as growlm_tasks
from growlm.tasks import cloze_examples, task_problems, task_specs

pytest.importorskip("lm_eval", reason="lm-evaluation-harness is growlm's eval extra (setup.sh installs it)")


def test_the_cloze_task_asks_for_the_last_word_of_each_held_out_unit():
    units = ['"Still wrong," squeaked the mouse.', "Too short here.", "The hen found a grain of wheat.",
             'She cried, "Oh!"', "He counted to 10.", "One two three four -"]
    assert cloze_examples(units) == [
        {"context": '"Still wrong," squeaked the', "target": "mouse"},
        {"context": "The hen found a grain of", "target": "wheat"},
    ]  # a quoted last word, a number and a lone dash are no plain last word; three words are too few
    assert len(cloze_examples(["a b c word."] * 10, max_examples=3)) == 3


def test_task_entries_are_registry_names_folders_or_growlm_s_own(tmp_path):
    specs = task_specs(["lambada_openai", "growlm_cloze", "my/tasks/"], bundled_dir="results/x/tasks")
    assert specs == [
        {"id": "lambada_openai", "name": "lambada_openai", "folder": None, "bundled": False},
        {"id": "growlm_cloze", "name": "growlm_cloze", "folder": "results/x/tasks/growlm_cloze", "bundled": True},
        {"id": "tasks", "name": None, "folder": "my/tasks", "bundled": False},
    ]


def test_without_the_harness_the_check_names_the_extra(monkeypatch):
    monkeypatch.setattr(growlm_tasks, "harness_version", lambda: None)
    [problem] = task_problems(["lambada_openai"])
    assert "lm-evaluation-harness is not installed" in problem and "eval extra" in problem
    assert task_problems([]) == []  # nothing is asked of the harness when no task is configured


def _refused(workflow_dir, overlay: str) -> str:
    (workflow_dir / "tasks.yaml").write_text(overlay)
    proc = run_snakemake(workflow_dir, "-n", "--cores", "1", "--configfile", str(TINY), "tasks.yaml", check=False)
    assert proc.returncode != 0, proc.stdout[-2000:]
    return proc.stdout + proc.stderr


def test_an_unknown_task_is_named_before_any_job(workflow_dir):
    out = _refused(workflow_dir, "evaluate: {tasks: [lambada_opnai]}\n")
    assert "'lambada_opnai' is not a task of lm-evaluation-harness" in out
    assert "did you mean lambada_openai" in out


def test_a_task_folder_that_does_not_parse_is_named_before_any_job(workflow_dir):
    folder = workflow_dir / "my_tasks"
    folder.mkdir()
    (folder / "mine.yaml").write_text("task: mine\ndataset_path: json\n  doc_to_text: [unclosed\n")
    out = _refused(workflow_dir, "evaluate: {tasks: [my_tasks/, no_such_folder/]}\n")
    assert "my_tasks/: mine.yaml does not parse" in out
    assert "no_such_folder/: no such folder" in out


def test_a_tracker_that_is_not_installed_is_named_before_any_job(workflow_dir):
    if shutil.which("wandb") or __import__("importlib").util.find_spec("wandb"):
        pytest.skip("wandb is installed here")
    out = _refused(workflow_dir, "train: {log_to: [tensorboard, wandb]}\n")
    assert "train.log_to: wandb is not installed" in out
    assert "train.log_to: tensorboard" not in out  # the eval extra is installed


@pytest.mark.slow
def test_tasks_land_in_the_comparison_the_csv_and_the_report(tiny_run, tmp_path):
    """growlm's cloze task on the finished tiny run: one job per model (members, M_0, every M_1), no
    training again; the scores are in comparison.csv (M_1's beside M_0's), eval/tasks.csv, the first
    page and the report."""
    wd = tmp_path / "wf"
    shutil.copytree(tiny_run, wd, symlinks=True)
    (wd / "results/tiny/report.html").unlink()  # the shared run's report, without tasks: made again below
    (wd / "tasks.yaml").write_text("evaluate: {tasks: [growlm_cloze], task_limit: 20}\n")
    args = ["--configfile", str(TINY), "tasks.yaml"]
    models = sum(len(list((wd / "results/tiny/models" / kind).glob("**/model.safetensors")))
                 for kind in ("small", "baseline", "refined"))  # the trained models (not the grown ones)
    planned = job_counts(run_snakemake(wd, "--cores", "2", *args).stderr)  # the run's plan, said as it starts
    assert planned["evaluate_tasks"] == models == 6 and planned["cloze_task"] == 1
    assert not {"train_small", "train_baseline", "refine", "grow"} & set(planned), planned
    res = wd / "results" / "tiny"

    data = [json.loads(line) for line in (res / "tasks/growlm_cloze/test.jsonl").read_text().splitlines()]
    test_units = (res / "corpus/level1/test.txt").read_text().splitlines()
    assert data and all(any(u.startswith(d["context"] + " " + d["target"]) for u in test_units) for d in data)

    comparison = pd.read_csv(res / "eval/comparison.csv")
    columns = list(comparison.columns)
    for metric in ("acc", "perplexity"):
        m0, m1 = f"m0_growlm_cloze/{metric}", f"m1_growlm_cloze/{metric}"
        assert columns.index(m1) == columns.index(m0) + 1  # M_1's beside M_0's
        assert comparison[m0].notna().all() and comparison[m1].notna().all()
    table = pd.read_csv(res / "eval/tasks.csv")
    assert len(table) == models * 2 and table["error"].isna().all()  # acc and perplexity of every model
    assert set(table["kind"]) == {"member", "M_0", "M_1"}
    assert (table["samples"] == 20).all()  # task_limit: the first 20 examples, the same for every model
    m1 = table[table["kind"] == "M_1"]
    members = table[table["kind"] == "member"]["training_flops"].max()
    assert (m1["training_flops"] > 2 * members).all()  # an M_1 counts its members and refinement
    for _, row in m1.iterrows():  # beyond its refinement (its ledger's FLOPs, alone more than both members):
        # the members its method grew from, both for concat, m_1 alone for hyperclone and concat's m_1-only control
        used = 2 if row["method"] == "concat+zero_block" else 1
        refinement = pd.read_csv(wd / row["dir"] / "ledger.csv")["flops"].iloc[-1]
        assert row["training_flops"] - refinement >= used * members, row
    record = json.loads(next(res.glob("eval/baseline/**/tasks/growlm_cloze.json")).read_text())
    assert record["settings"]["random_seed"] == 0 and record["settings"]["device"] == "cpu"

    assert "Benchmark tasks" in (res / "report/summary.rst").read_text()
    shown = (res / "report/tasks.html").read_text()
    assert shown.count("<tr") == 1 + models  # the header, then one row per model
    assert "<th>growlm_cloze acc ↑</th>" in shown and "<th>growlm_cloze perplexity ↓</th>" in shown
    assert (res / "report/tasks.svg").stat().st_size > 5000
    assert "M_1 growlm_cloze/acc" in (res / "report/comparison.html").read_text()
    run_snakemake(wd, "--cores", "1", *args, "--report", "results/tiny/report.html")
    html = (res / "report.html").read_text(errors="replace")
    assert "Benchmark tasks" in html and "tasks.svg" in html


@pytest.mark.slow
def test_a_failing_task_is_recorded_and_named_not_raised(tiny_run, tmp_path):
    """A task whose data cannot be read: the run gives a record with the error (the job succeeds, so
    every other result stays), and the table and the first page name the task and the model."""
    from growlm.task_table import task_table
    from growlm.jobs.evaluate import evaluate_tasks
    from growlm.report import summary_sentences, tasks_html

    folder = tmp_path / "broken"
    folder.mkdir()
    (folder / "broken.yaml").write_text(
        "task: broken_data\ndataset_path: json\ndataset_kwargs: {data_files: {test: " + str(tmp_path / "gone.jsonl")
        + "}}\noutput_type: loglikelihood\ntest_split: test\ndoc_to_text: '{{context}}'\ndoc_to_target: "
        "'{{target}}'\nmetric_list: [{metric: acc, aggregation: mean, higher_is_better: true}]\n")
    assert task_problems([str(folder)]) == []  # it parses: only running it shows the missing data
    member = tiny_run / "results/tiny/models/small/d16_L1/s0/m1"
    spec = task_specs([str(folder)], bundled_dir="unused")[0]
    out = tmp_path / "eval" / "broken.json"
    evaluate_tasks(model_dir=member, spec=spec, limit=5, out_file=out)  # the job's function: it returns
    record = json.loads(out.read_text())
    assert record["error"] and record["tasks"] == ["broken_data"] and not record["scores"]
    assert record["model"] == str(member)

    combos = [{"d0": 16, "L0": 1, "d1": 32, "L1": 2, "n": 2, "method": "m", "seed": 0, "budget": 1, "lr": 1}]
    paths = {"small": str(tiny_run / "results/tiny/models/small/d{d0}_L{L0}/s{seed}/m{member}"),
             "baseline": "b", "refined": "r", "grown": "g"}
    table = task_table(combos, paths, [out])
    assert len(table) == 1 and table["entry"].iloc[0] == "broken" and table["error"].iloc[0] == record["error"]
    tasks_html(table, tmp_path / "t.html")
    assert f"task broken failed on {member}" in (tmp_path / "t.html").read_text()
    table.to_csv(tmp_path / "tasks.csv", index=False)
    pd.DataFrame([{"d0": 16, "L0": 1, "d1": 32, "L1": 2, "n": 2, "budget": 24000, "seed": 0, "method": "m",
                   "arm": "grown from n members", "members_used": 2, "reached": False, "cost_ratio": None,
                   "cost_ratio_small_free": None, "m0_final_val_loss": 5.0, "m1_final_val_loss": 5.1}]
                 ).to_csv(tmp_path / "comparison.csv", index=False)
    text = "\n".join(summary_sentences(tmp_path / "comparison.csv", tmp_path / "tasks.csv"))
    assert "failed task run(s)" in text and f"task broken failed on {member}" in text


def test_a_llama_model_runs_the_cloze_task_through_the_harness(tmp_path):
    """lm-evaluation-harness loads a growlm Llama model folder (LlamaForCausalLM with its tokenizer,
    through the same from_pretrained call as a GPT-2's) and scores growlm's cloze task on it: every
    example answered, accuracy within [0, 1], a finite perplexity; the same model twice, the same scores."""
    from growlm.jobs.evaluate import evaluate_tasks
    from growlm.model import build_model, save_model
    from growlm.tokenizer import fit_tokenizer, vocab_size
    from conftest import REPO

    corpus = REPO / "workflow" / "resources" / "corpus"
    fit_tokenizer([corpus / "pg18735_little_red_hen.txt"], tmp_path / "tok", vocab_size=400)
    model = build_model(seed=3, family="llama", n_embd=16, n_layer=1, vocab_size=vocab_size(tmp_path / "tok"),
                        n_positions=64, head_dim=8, heads_per_kv=2, mlp_ratio=3, tie_word_embeddings=False)
    save_model(model, tmp_path / "llama", tokenizer_dir=tmp_path / "tok")
    assert json.loads((tmp_path / "llama" / "config.json").read_text())["model_type"] == "llama"
    text = tmp_path / "test.txt"
    text.write_text("The little red hen found a grain of wheat.\nWho will help me plant this wheat said the hen.\n"
                    "Not I said the duck and the cat and the dog.\n" * 4)
    growlm_tasks.write_cloze_task(REPO / "workflow" / "resources" / "tasks" / "growlm_cloze", text,
                                  tmp_path / "tasks" / "growlm_cloze")
    spec = task_specs(["growlm_cloze"], bundled_dir=tmp_path / "tasks")[0]
    records = [evaluate_tasks(model_dir=tmp_path / "llama", spec=spec, limit=6, out_file=tmp_path / f"r{i}.json")
               for i in range(2)]
    record = records[0]
    assert record["error"] is None, record["error"]
    scores = record["scores"]["growlm_cloze"]
    assert 0.0 <= scores["acc,none"] <= 1.0 and 1.0 < scores["perplexity,none"] < float("inf")
    assert records[1]["scores"] == record["scores"]
