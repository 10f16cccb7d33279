"""The tiny workflow in the Llama family, and from members you already have (`members.pretrained`):
local save_pretrained folders of both families, each with its own tokenizer, loaded through the same
`from_pretrained` call a Hub id takes. Their bad inputs stop the run before any job."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM, GPT2LMHeadModel, LlamaForCausalLM

from conftest import REPO, TINY, job_counts, run_snakemake
from growlm.model import build_model, save_model
from growlm.tokenizer import fit_tokenizer

FAST = "profile: {tools: []}\ncontrols: {single_member: false, ensemble: false}\n"  # no profiling, no controls


def members(root: Path, family: str, *, n: int = 2, d: int = 16, vocab_book: str = "pg18735_little_red_hen.txt",
            vocab: int = 400) -> list[str]:
    """n random members of `family` saved as save_pretrained folders with their own tokenizer (fitted on
    one bundled book, not on the experiment's corpus), as someone else's small models would come."""
    tok = root / "tokenizer"
    fit_tokenizer([REPO / "workflow" / "resources" / "corpus" / vocab_book], tok, vocab_size=vocab)
    from growlm.tokenizer import vocab_size

    extra = {"heads_per_kv": 2, "mlp_ratio": 3} if family == "llama" else {}
    out = []
    for i in range(n):
        model = build_model(seed=70 + i, family=family, n_embd=d, n_layer=1, vocab_size=vocab_size(tok),
                            n_positions=64, head_dim=8, tie_word_embeddings=family == "gpt2", **extra)
        save_model(model, root / f"m{i + 1}", tokenizer_dir=tok)
        (root / f"m{i + 1}" / "growlm.json").unlink(missing_ok=True)
        out.append(str(root / f"m{i + 1}"))
    return out


def rows(wd: Path, experiment: str) -> list[dict]:
    return list(csv.DictReader(open(wd / "results" / experiment / "eval" / "comparison.csv")))


@pytest.mark.slow
def test_the_tiny_workflow_runs_in_the_llama_family(tiny_run, tmp_path):
    """The tiny experiment again in the Llama family, in a copy of its GPT-2 run: the corpus and tokenizer
    stay, every model is made again (the family is a setting of every model job). One method here: every
    operator's Llama form is checked for exactness in tests/test_families.py."""
    wd = tmp_path / "wf"
    shutil.copytree(tiny_run, wd, symlinks=True)
    (wd / "llama.yaml").write_text("model: {family: llama}\nmethods: [[concat, zero_block]]\n" + FAST)
    proc = run_snakemake(wd, "--cores", "2", "--configfile", str(TINY), "llama.yaml")
    assert "fit_tokenizer" not in proc.stdout + proc.stderr and "train_small" in proc.stdout + proc.stderr
    got = rows(wd, "tiny")
    assert {r["method"] for r in got} == {"concat+zero_block"}
    assert all(float(r["m1_final_val_loss"]) < float(r["m1_step0_val_loss"]) for r in got)
    for kind in ("small/d16_L1/s0/m1", "baseline/d32_L2/t24000_lr0.003/s0",
                 "refined/concat+zero_block/d16_L1_to_d32_L2/n2/t24000_lr0.003/s0"):
        folder = wd / "results" / "tiny" / "models" / kind
        model = AutoModelForCausalLM.from_pretrained(folder)
        assert type(model) is LlamaForCausalLM and model.config.num_key_value_heads * 2 == \
            model.config.num_attention_heads
    # the grown model started where its members' logit average was (concat is exact in Llama too)
    ledger = list(csv.DictReader(open(wd / "results/tiny/models/refined/concat+zero_block/d16_L1_to_d32_L2/n2/"
                                          "t24000_lr0.003/s0/ledger.csv")))
    assert ledger[0]["step"] == "0" and float(ledger[0]["val_loss"]) > 0


@pytest.mark.slow
def test_the_workflow_grows_pretrained_members_of_both_families(workflow_dir):
    """Llama members with unknown cost (the comparison reports the members-free ratio and says the cost
    is not counted), GPT-2 members with a stated cost (counted); in both, the corpus is encoded with the
    members' tokenizer and M_0 and M_1 are of the members' family and vocabulary."""
    wd = workflow_dir
    llama_members = members(wd / "mine_llama", "llama")
    gpt2_members = members(wd / "mine_gpt2", "gpt2", vocab_book="pg14642_mcguffey_eclectic_primer.txt", vocab=350)
    (wd / "pre_llama.yaml").write_text(
        f"experiment: pre_llama\nmethods: [msg]\nmembers: {{pretrained: {json.dumps(llama_members)}}}\n" + FAST)
    (wd / "pre_gpt2.yaml").write_text(
        f"experiment: pre_gpt2\nmethods: [[concat, zero_block]]\n"
        f"members: {{pretrained: {json.dumps(gpt2_members)}, cost: {{tokens: 50000}}}}\n" + FAST)
    for overlay, family, cls in (("pre_llama", "llama", LlamaForCausalLM), ("pre_gpt2", "gpt2", GPT2LMHeadModel)):
        # the Llama run makes the report (its words on the members' cost are checked); the GPT-2 one stops at
        # the comparison
        targets = [] if family == "llama" else [f"results/{overlay}/eval/comparison.csv"]
        run_snakemake(wd, *targets, "--cores", "2", "--configfile", str(TINY), f"{overlay}.yaml")
        (row,) = rows(wd, overlay)
        member_vocab = json.loads(Path(f"{wd}/mine_{family}/m1/config.json").read_text())["vocab_size"]
        for kind in ("baseline/d32_L2/t24000_lr0.003/s0", f"refined/{row['method']}/d16_L1_to_d32_L2/n2/t24000_lr0.003/s0"):
            model = AutoModelForCausalLM.from_pretrained(wd / "results" / overlay / "models" / kind)
            assert type(model) is cls and model.config.vocab_size == member_vocab
        tok = json.loads((wd / "results" / overlay / "tokenizer" / "tokenizer.json").read_text())
        assert tok == json.loads(Path(f"{wd}/mine_{family}/m1/tokenizer.json").read_text())  # the members' own
        assert not (wd / "results" / overlay / "models" / "small").exists()  # no member trained
        if family == "llama":
            report = (wd / "results" / overlay / "report" / "summary.rst").read_text()
            assert row["members_cost"] == "unknown" and row["cost_ratio"] == "" and row["small_flops"] == ""
            assert float(row["cost_ratio_small_free"] or "nan") > 0 or row["reached"] == "False"
            assert "the members' own training cost is not counted" in report or "did not reach" in report
        else:
            assert row["members_cost"] == "stated"
            assert float(row["small_flops"]) > 0  # 2 members x 50,000 tokens x their FLOPs per token


def test_bad_pretrained_members_are_named_before_any_job(workflow_dir, tmp_path):
    wd = workflow_dir
    llama_members = members(tmp_path / "l", "llama")
    gpt2_members = members(tmp_path / "g", "gpt2", vocab_book="pg14642_mcguffey_eclectic_primer.txt", vocab=350)
    other_tok = members(tmp_path / "o", "llama", vocab_book="pg14642_mcguffey_eclectic_primer.txt")
    empty = tmp_path / "empty"
    empty.mkdir()
    cases = {
        "no config.json": ([str(empty), llama_members[0]], "no config.json"),
        "families": ([llama_members[0], gpt2_members[0]], "its family is gpt2, member 1's llama"),
        "tokenizers": ([llama_members[0], other_tok[1]], "its tokenizer differs from member 1's"),
        "missing": ([llama_members[0], str(tmp_path / "nowhere")], "no such folder"),
    }
    for name, (items, expected) in cases.items():
        (wd / "bad.yaml").write_text(f"members: {{pretrained: {json.dumps(items)}}}\n")
        proc = run_snakemake(wd, "-n", "--cores", "1", "--configfile", str(TINY), "bad.yaml", check=False)
        text = proc.stdout + proc.stderr
        assert proc.returncode != 0 and expected in text, (name, text[-2000:])
    # a width the operator cannot reach with these members, too few members, a head-size change under
    # rotary positions, and growlm's own member settings
    for overlay, expected in [
        ("d1: [48]\nmethods: [concat]", "concat"),
        ("n: [3]", "n = 3: members.pretrained names 2 member(s)"),
        ("d1: [36]\nmethods: [msg]", "a head-size change under rotary positions"),
        ("data: shards", "members.data and members.trunk say how growlm trains its members"),
    ]:
        member_keys = ", data: shards" if overlay == "data: shards" else ""
        rest = "" if member_keys else overlay
        (wd / "bad.yaml").write_text(f"members: {{pretrained: {json.dumps(llama_members)}{member_keys}}}\n{rest}\n")
        proc = run_snakemake(wd, "-n", "--cores", "1", "--configfile", str(TINY), "bad.yaml", check=False)
        text = proc.stdout + proc.stderr
        assert proc.returncode != 0 and expected in text, (overlay, text[-2000:])
    # the members make d0 and L0: a sweep over d0 is theirs
    (wd / "ok.yaml").write_text(f"members: {{pretrained: {json.dumps(llama_members)}}}\n" + FAST)
    proc = run_snakemake(wd, "-n", "--cores", "1", "--quiet", "rules", "--configfile", str(TINY), "ok.yaml")
    counts = job_counts(proc.stdout)
    assert counts["import_member"] == 2 and counts["member_tokenizer"] == 1 and "train_small" not in counts
    shutil.rmtree(empty)
