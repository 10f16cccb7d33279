"""The tiny workflow in the Llama family, and from members you already have (`members.pretrained`):
local save_pretrained folders of both families, each with its own tokenizer, loaded through the same
`from_pretrained` call a Hub id takes. Their bad inputs stop the run before any job."""

from __future__ import annotations

import csv
import json
import math
import shutil
from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM, LlamaForCausalLM

from conftest import REPO, TINY, copy_run, job_counts, plan, planned_counts, run_output, run_snakemake
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
    """The tiny experiment's models again in the Llama family, in a copy of its GPT-2 run: the corpus and
    tokenizer stay, every model is made again (the family is a setting of every model job): the member,
    M_0 and one arm (one method grown from one member here: every operator's Llama form is checked for
    exactness in tests/test_families.py). The run asks for M_0 and the arm's M_1 only: the evaluations, the
    comparison and the report of Llama models are checked by the Llama members' run of
    test_the_workflow_grows_pretrained_llama_members (up to the report's first page)."""
    wd = copy_run(tiny_run, tmp_path / "wf")
    (wd / "llama.yaml").write_text("model: {family: llama}\nmethods: [[hyperclone, zero_block]]\nn: [1]\n" + FAST)
    refined = "refined/hyperclone+zero_block/d16_L1_to_d32_L2/n1/t24000_lr0.003/s0"
    kinds = ("small/d16_L1/s0/m1", "baseline/d32_L2/t24000_lr0.003/s0", refined)
    proc = run_snakemake(wd, *(f"results/tiny/models/{kind}/model.safetensors" for kind in kinds[1:]),
                         "--cores", "2", "--configfile", str(TINY), "llama.yaml")
    assert "fit_tokenizer" not in proc.stdout + proc.stderr
    # the member, M_0 and the one arm of the overlay's methods (not tiny.yaml's two), nothing else
    assert job_counts(proc.stderr) == {"train_small": 1, "train_baseline": 1, "grow": 1, "refine": 1}, proc.stderr
    for kind in kinds:
        folder = wd / "results" / "tiny" / "models" / kind
        model = AutoModelForCausalLM.from_pretrained(folder)
        assert type(model) is LlamaForCausalLM and model.config.num_key_value_heads * 2 == \
            model.config.num_attention_heads
    # the grown model started where its member was (hyperclone is exact in Llama too), and
    # learned: its last validation loss below its first (the comparison's m1_final_val_loss and
    # m1_step0_val_loss are these two)
    ledger = list(csv.DictReader(open(wd / "results" / "tiny" / "models" / refined / "ledger.csv")))
    assert ledger[0]["step"] == "0" and float(ledger[0]["val_loss"]) > 0
    losses = [v for v in (float(r["val_loss"] or "nan") for r in ledger) if not math.isnan(v)]
    assert losses[-1] < losses[0]


# The members of the shared run `pretrained_run` (tests/conftest.py): two Llama members of width 32 in the run's
# folder, named by relative paths (a copy of the run finds its own copy of them), grown to width 64 (the config's
# d0 is 16: the members' shape overrides it) by msg from member 1 and by [concat, zero_block] from both.
PRETRAINED = ["./mine/m1", "./mine/m2"]
TOKENS = [f"results/tiny/tokens/level{level}/{split}.npy" for level in (0, 1) for split in ("train", "val", "test")]
PRETRAINED_TARGETS = ("results/tiny/report/summary.rst", *TOKENS)  # the report's first page and every token file


def pretrained_overlay(items=PRETRAINED, extra: str = "") -> str:
    """The overlay of `pretrained_run` (pre.yaml) with the members `items` and more keys of `members` (`extra`)."""
    return (f"d1: [64]\nmethods: [msg, [concat, zero_block]]\nmembers: {{pretrained: {json.dumps(items)}{extra}}}\n"
            + FAST)


def make_pretrained(wd: Path) -> list[str]:
    """The members of `pretrained_run`, made in its folder."""
    return members(wd / "mine", "llama", d=32)


@pytest.mark.slow
def test_the_workflow_grows_pretrained_llama_members(pretrained_run, tmp_path):
    """Llama members with unknown cost (the comparison reports the members-free ratio and says the cost
    is not counted), then with a stated cost (counted): the corpus is encoded with the members' tokenizer
    and M_0 and M_1 are of the members' family and vocabulary. The shared run `pretrained_run` (a copy of the
    shared tiny run less its tokenizer, tokens and models, its corpus kept, up to the report's first page:
    its words on the members' cost are checked); then, in a copy of it, the cost stated makes the comparison
    alone again. GPT-2 members' family, vocabulary and tokenizer are checked by tests/test_offline.py's run of
    GPT-2 members from the Hub's cache; what the members are known by, in copies of this run, by
    tests/test_identity.py's test_members_are_known_by_content_not_by_date."""
    experiment = "tiny"  # the shared run's: its corpus is reused
    res = f"results/{experiment}"

    wd = pretrained_run
    mine = [str(wd / m) for m in PRETRAINED]
    out = run_output(wd, 0).read_text()
    assert "member_tokenizer" in out and "prepare_source" not in out  # the members' tokenizer; corpus kept
    member_vocab = json.loads(Path(mine[0], "config.json").read_text())["vocab_size"]
    for kind in ("baseline/d64_L2/t24000_lr0.003/s0", "refined/msg/d32_L1_to_d64_L2/n2/t24000_lr0.003/s0",
                 "refined/concat+zero_block/d32_L1_to_d64_L2/n2/t24000_lr0.003/s0"):
        model = AutoModelForCausalLM.from_pretrained(wd / res / "models" / kind)
        assert type(model) is LlamaForCausalLM and model.config.vocab_size == member_vocab, kind
    tok = json.loads((wd / res / "tokenizer" / "tokenizer.json").read_text())
    assert tok == json.loads(Path(mine[0], "tokenizer.json").read_text())  # the members' own
    assert not (wd / res / "models" / "small").exists()  # no member trained

    arms = {r["method"]: r for r in rows(wd, experiment)}
    assert set(arms) == {"msg", "concat+zero_block"}
    row = arms["msg"]
    report = (wd / res / "report" / "summary.rst").read_text()
    assert row["members_cost"] == "unknown" and row["cost_ratio"] == "" and row["small_flops"] == ""
    assert float(row["cost_ratio_small_free"] or "nan") > 0 or row["reached"] == "False"
    assert "the members' own training cost is not counted" in report or "did not reach" in report
    # their cost stated: counted, and only the comparison is made again (no import, model or token file)
    wd = copy_run(pretrained_run, tmp_path / "stated")
    (wd / "pre.yaml").write_text(pretrained_overlay(extra=", cost: {tokens: 50000}"))
    proc = run_snakemake(wd, f"{res}/eval/comparison.csv", "--cores", "2", "--configfile", str(TINY), "pre.yaml")
    assert job_counts(proc.stderr) == {"compare": 1}, proc.stderr[-3000:]
    row = {r["method"]: r for r in rows(wd, experiment)}["msg"]
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
        if name == "no config.json":  # what the terminal shows: a real dry run
            proc = run_snakemake(wd, "-n", "--cores", "1", "--configfile", str(TINY), "bad.yaml", check=False)
            text = proc.stdout + proc.stderr
            assert proc.returncode != 0 and "Traceback (most recent call last)" not in text
        else:  # the same parse in this process (conftest's plan)
            text, _ = plan(wd, configfiles=(TINY, "bad.yaml"))
        assert text is not None and expected in text, (name, text[-2000:])
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
        text, _ = plan(wd, configfiles=(TINY, "bad.yaml"))
        assert text is not None and expected in text, (overlay, text[-2000:])
    # the members make d0 and L0: a sweep over d0 is theirs
    (wd / "ok.yaml").write_text(f"members: {{pretrained: {json.dumps(llama_members)}}}\n" + FAST)
    counts = planned_counts(wd, configfiles=(TINY, "ok.yaml"))
    assert counts["import_member"] == 2 and counts["member_tokenizer"] == 1 and "train_small" not in counts
    shutil.rmtree(empty)


def llama_like(root: Path, kind: str, *, n: int = 2, sliding_window: int | None = None,
               dtype: str = "float32") -> list[str]:
    """n tiny members of a family growlm reads as Llama, made with transformers directly (Qwen2ForCausalLM
    with random q, k, v biases, or MistralForCausalLM with `sliding_window`), saved in `dtype` with one
    fitted tokenizer, as such models come from the Hub."""
    import torch
    from transformers import AutoTokenizer, MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM

    from growlm.tokenizer import vocab_size

    tok = root / "tokenizer"
    fit_tokenizer([REPO / "workflow" / "resources" / "corpus" / "pg18735_little_red_hen.txt"], tok, vocab_size=300)
    sizes = dict(vocab_size=vocab_size(tok), hidden_size=16, intermediate_size=48, num_hidden_layers=2,
                 num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256)
    out = []
    for i in range(n):
        torch.manual_seed(80 + i)
        if kind == "qwen2":
            model = Qwen2ForCausalLM(Qwen2Config(**sizes))
            with torch.no_grad():  # their biases are zero at initialisation: make them count
                for name, p in model.named_parameters():
                    if name.endswith("bias"):
                        p.normal_()
        else:
            model = MistralForCausalLM(MistralConfig(**sizes, sliding_window=sliding_window))
        folder = root / f"{kind}{i + 1}"
        model.to(getattr(torch, dtype)).save_pretrained(folder)
        AutoTokenizer.from_pretrained(tok).save_pretrained(folder)
        out.append(str(folder))
    return out


def test_member_files_are_checked_member_by_member_before_any_job(workflow_dir, tmp_path):
    """Each member's own files, named with its number (from 1) and what was looked for: missing
    tokenizer files (not blamed on another member), a tokenizer.json that does not parse, weights whose
    shapes are not their config's (the safetensors header, read without torch), a weights file cut short;
    a slow tokenizer's files are accepted."""
    from growlm import pretrained

    good, base = members(tmp_path / "l", "llama")

    def variant(name: str) -> Path:
        folder = tmp_path / name
        shutil.copytree(base, folder)
        return folder

    no_tok, no_tok_2, bad_tok, bad_weights, cut, slow = (variant(n) for n in (
        "no_tok", "no_tok_2", "bad_tok", "bad_weights", "cut", "slow"))
    for folder in (no_tok, no_tok_2):
        for name in ("tokenizer.json", "tokenizer_config.json"):
            (folder / name).unlink()
    (bad_tok / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "BPE"}}')
    cfg = json.loads((bad_weights / "config.json").read_text())
    vocab = cfg["vocab_size"]
    (bad_weights / "config.json").write_text(json.dumps({**cfg, "vocab_size": vocab + 7}))
    data = (cut / "model.safetensors").read_bytes()
    (cut / "model.safetensors").write_bytes(data[: len(data) // 2])
    tok = json.loads((slow / "tokenizer.json").read_text())
    (slow / "tokenizer.json").unlink()
    (slow / "vocab.json").write_text(json.dumps(tok["model"]["vocab"]))
    (slow / "merges.txt").write_text("#version: 0.2\n" + "\n".join(" ".join(m) for m in tok["model"]["merges"]))
    (slow / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "GPT2Tokenizer"}))

    # one dry run: every bad member named with its number, none blamed for another
    items = [good, str(no_tok), str(bad_tok), str(bad_weights)]
    (wd := workflow_dir / "bad.yaml").write_text(f"members: {{pretrained: {json.dumps(items)}}}\n")
    proc = run_snakemake(workflow_dir, "-n", "--cores", "1", "--configfile", str(TINY), "bad.yaml", check=False)
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0, text[-3000:]
    for expected in [
        f"member 2 (members.pretrained, {no_tok}): no tokenizer files (tokenizer.json, or tokenizer_config.json "
        f"with vocab/merges files)",
        f"member 3 (members.pretrained, {bad_tok}): its tokenizer.json does not load (",
        f"member 4 (members.pretrained, {bad_weights}): its weights do not match its config.json "
        f"(model.embed_tokens.weight is {vocab} x 16, where its vocab_size x hidden_size make {vocab + 7} x 16",
    ]:
        assert expected in text, (expected, text[-3000:])
    assert "differs" not in text and "member 1 (" not in text and "members.pretrained[" not in text
    wd.unlink()

    def found(items):
        return pretrained.problems([str(i) for i in items], n_values=[1], context=64)[0]

    assert found([no_tok, no_tok_2]) == [
        f"member {k} (members.pretrained, {f}): no tokenizer files (tokenizer.json, or tokenizer_config.json with "
        f"vocab/merges files); save its tokenizer with it (tokenizer.save_pretrained)"
        for k, f in ((1, no_tok), (2, no_tok_2))]
    (problem,) = found([good, cut])
    assert problem.startswith(f"member 2 (members.pretrained, {cut}): its model.safetensors does not load (cut short")
    assert found([slow]) == []
    (problem,) = found([good, slow])  # the same tokenizer in other files: not comparable before any job
    assert "its tokenizer is in vocab.json and merges.txt, member 1's in tokenizer.json" in problem


def test_qwen2_and_mistral_members_are_read_as_llama(workflow_dir, tmp_path, capsys):
    """Qwen2 (q, k, v biases) and Mistral without a sliding window shorter than the context are Llama
    in all but configuration: the config check accepts them (bfloat16 members with one warning line
    each: growlm trains in float32), the import makes each a LlamaForCausalLM whose logits are the
    member's, and a sliding window shorter than model.context is refused in one line."""
    import torch

    from growlm import pretrained
    from growlm.errors import GrowlmError
    from growlm.jobs.train import import_member

    qwen = llama_like(tmp_path / "q", "qwen2", dtype="bfloat16")
    (workflow_dir / "qwen.yaml").write_text(f"members: {{pretrained: {json.dumps(qwen)}}}\n" + FAST)
    proc = run_snakemake(workflow_dir, "-n", "--cores", "1", "--quiet", "rules", "--configfile", str(TINY),
                         "qwen.yaml")
    for k, folder in enumerate(qwen, start=1):
        assert (f"growlm: warning: member {k} (members.pretrained, {folder}): its weights are bfloat16; growlm "
                f"trains in float32, so the import converts them to float32") in proc.stderr, proc.stderr[-3000:]
    assert job_counts(proc.stdout)["import_member"] == 2

    mistral = llama_like(tmp_path / "m", "mistral", n=1)  # no sliding window
    long_window = llama_like(tmp_path / "w", "mistral", n=1, sliding_window=4096)  # longer than the context
    short_window = llama_like(tmp_path / "s", "mistral", n=1, sliding_window=32)
    for items in (mistral, long_window):
        problems, read = pretrained.problems(items, n_values=[1], context=128)
        assert problems == [] and read[0]["shape"].family == "llama" and not read[0]["shape"].attention_bias
    assert pretrained.problems(qwen, n_values=[2], context=128)[1][0]["shape"].attention_bias
    (problem,) = pretrained.problems(short_window, n_values=[1], context=128)[0]
    assert problem.startswith(f"member 1 (members.pretrained, {short_window[0]}): a 'mistral' model with a sliding "
                              f"attention window of 32 tokens, shorter than model.context = 128")

    ids = torch.randint(0, 250, (2, 128), generator=torch.Generator().manual_seed(1))
    for src in (qwen[0], mistral[0], long_window[0]):
        out = tmp_path / "imported" / Path(src).name / "m1"
        info = import_member(src, out_dir=out, context=128)
        imported = AutoModelForCausalLM.from_pretrained(out)
        original = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
        assert type(imported) is LlamaForCausalLM and info["converted_from"] == original.config.model_type
        with torch.no_grad():
            assert torch.equal(imported(ids).logits, original(ids).logits), src
        assert imported.config.attention_bias == (src in qwen)
        if src in qwen:  # Llama's attention_bias puts a bias on o too: zero, as Qwen2 has none
            assert all(not blk.self_attn.o_proj.bias.any() for blk in imported.model.layers)
            assert info["source_dtype"] == "bfloat16"
    assert "member 1 (members.pretrained, %s): its weights are bfloat16" % qwen[0] in capsys.readouterr().out
    with pytest.raises(GrowlmError, match="sliding attention window of 32 tokens, shorter than model.context = 128"):
        import_member(short_window[0], out_dir=tmp_path / "imported" / "short" / "m1", context=128)


def test_members_that_differ_in_any_setting_of_their_function_are_named_before_any_job(workflow_dir, tmp_path):
    """Every setting of a member's config.json that changes what it computes is compared before any job,
    not only its shape: rotary settings (theta, scaling), positions, activation, norm epsilon. M_0 and
    the grown model are built from member 1's config, so a member 2 that differs would lose its own
    setting without a word. Settings that change nothing (bookkeeping, dropout, the initialisation, the
    rotary settings spelled the older way) are not differences."""
    from growlm import pretrained

    def variant(base: str, name: str, **changes) -> str:
        folder = tmp_path / name
        shutil.copytree(base, folder)
        cfg = json.loads((folder / "config.json").read_text())
        for key, value in changes.items():
            cfg.pop(key, None) if value is None else cfg.__setitem__(key, value)
        (folder / "config.json").write_text(json.dumps(cfg))
        return str(folder)

    first, second = members(tmp_path / "l", "llama")
    scaling = {"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0}
    for changes, expected in [
        ({"rope_parameters": scaling}, 'its rotary settings {"factor": 4.0, "rope_theta": 10000.0, "rope_type": '
                                       '"linear"} differs from member 1\'s (rotary settings {"rope_theta": 10000.0, '
                                       '"rope_type": "default"})'),
        ({"rope_parameters": None, "rope_theta": 500000.0}, '"rope_theta": 500000.0'),
        ({"rope_parameters": None, "rope_scaling": {"type": "linear", "factor": 4.0}}, '"factor": 4.0'),
        ({"max_position_embeddings": 128}, "its max_position_embeddings 128 differs from member 1's"),
        ({"hidden_act": "gelu"}, "its hidden_act \"gelu\" differs from member 1's (hidden_act \"silu\")"),
        ({"rms_norm_eps": 1e-6}, "its rms_norm_eps 1e-06 differs from member 1's (rms_norm_eps 1e-05)"),
    ]:
        other = variant(second, f"v{len(list(tmp_path.iterdir()))}", **changes)
        (problem,) = pretrained.problems([first, other], n_values=[2], context=64)[0]
        assert problem.startswith(f"member 2 (members.pretrained, {other}): ") and expected in problem, problem
    same = variant(second, "same", rope_parameters=None, rope_theta=10000.0, rope_scaling=None, architectures=None,
                   transformers_version="4.40.0", initializer_range=0.01, attention_dropout=0.1)
    assert pretrained.problems([first, same], n_values=[2], context=64)[0] == []
    g1, g2 = members(tmp_path / "g", "gpt2")
    for changes, expected in [({"activation_function": "gelu_new"}, "its activation_function \"gelu_new\""),
                              ({"layer_norm_epsilon": 1e-6}, "its layer_norm_epsilon 1e-06")]:
        (problem,) = pretrained.problems([g1, variant(g2, f"g{len(changes)}{expected[4:8]}", **changes)],
                                         n_values=[2], context=64)[0]
        assert expected in problem, problem
    # before any job: the dry run stops on it
    (workflow_dir / "rope.yaml").write_text(
        f"members: {{pretrained: {json.dumps([first, variant(second, 'scaled', rope_parameters=scaling)])}}}\n")
    proc = run_snakemake(workflow_dir, "-n", "--cores", "1", "--configfile", str(TINY), "rope.yaml", check=False)
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "its rotary settings" in text and "Building DAG" not in text, text[-2000:]
