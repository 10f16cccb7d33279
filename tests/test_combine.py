"""Several members worth more than one, and your own method (issue: combining members, plugins).

* msg_members is exactly m_1 at step 0 and places every other member block-diagonally;
* merge recovers a model from a permuted copy of itself (weight matching), and the linear
  assignment is optimal;
* the teachers' KL term has the gradient T (softmax(z/T) - softmax(t/T)) / N, and the teachers'
  forward FLOPs are in the refinement's ledger;
* freeze holds exactly the inherited entries for its steps and lets the new ones train;
* clusters of books are disjoint, cover every book and balance tokens;
* a plugin operator runs through a real tiny workflow; a broken plugin stops before any job.
"""

from __future__ import annotations

import csv
import itertools
import json

import numpy as np
import pytest
import torch
from conftest import REPO, TINY, TINY2, copy_workflow, learnable_tokens, run_snakemake

from growlm.errors import GrowlmError
from growlm.flops import forward_flops_per_token, model_train_flops_per_token
from growlm.growth import grow, load_plugins
from growlm.growth.algebra import pack, unpack
from growlm.growth.members import linear_assignment, permute
from growlm.growth.moments import inherited_masks
from growlm.jobs.plugins import check_operator
from growlm.loss import distill_loss
from growlm.methods import OPERATORS, growth_names, members_used, plan_chain
from growlm.model import build_model, save_model
from growlm.plugins import declare, describe
from growlm.shape import ModelShape
from growlm.tokens import book_clusters, cluster
from growlm.train import train
from growlm.train_config import TrainConfig

V, T = 97, 16


@pytest.fixture(autouse=True)
def operators_as_they_were():
    """Each test starts with growlm's own operators only, and plugins it registers are forgotten after
    it: other tests in this process (e.g. the rerun table's Snakefile parses) read their own copies of
    the same plugin files, which declare the same operator names from other paths."""
    from growlm.growth.registry import IMPLEMENTATIONS
    from growlm.refiners import REFINERS

    saved = dict(OPERATORS), dict(IMPLEMENTATIONS), dict(REFINERS)
    for name in [n for n, spec in OPERATORS.items() if spec.source != "growlm"]:
        OPERATORS.pop(name)
        IMPLEMENTATIONS.pop(name, None)
        REFINERS.pop(name, None)
    yield
    for table, before in zip((OPERATORS, IMPLEMENTATIONS, REFINERS), saved):
        table.clear()
        table.update(before)


def members(n, d=16, L=2, dtype=torch.float64):
    return [build_model(seed=10 + i, n_embd=d, n_layer=L, n_positions=T, head_dim=8, vocab_size=V).to(dtype)
            for i in range(n)]


def logits(model, x):
    with torch.no_grad():
        return model(input_ids=x).logits


X = torch.randint(0, V, (3, T), generator=torch.Generator().manual_seed(0))


# ----------------------------------------------------------------------------------------------
# msg_members and merge
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n,cross", [(2, "random"), (3, "zero"), (4, "random")])
def test_msg_members_is_exactly_m1_at_step_0_and_holds_every_member(n, cross):
    ms = members(n)
    g = grow(ms, "msg_members", n_embd=16 * n, n_layer=4, seed=3, ramp_steps=10, cross=cross)
    assert (logits(g, X) - logits(ms[0], X)).abs().max() < 1e-12
    # the same random new weights as msg of m_1: with one member it is msg
    solo = grow(ms[:1], "msg_members", n_embd=16 * n, n_layer=4, seed=3, ramp_steps=10)
    ref = grow(ms[:1], "msg", n_embd=16 * n, n_layer=4, seed=3, ramp_steps=10)
    assert all(torch.equal(a, b) for a, b in zip(solo.parameters(), ref.parameters()))
    # member j sits in the j-th block of coordinates of every old block (interleave: blocks 0 and 2)
    W, f0 = unpack(g.inner), 64
    for j, m in enumerate(ms):
        M, r, f = unpack(m), slice(16 * j, 16 * (j + 1)), slice(f0 * j, f0 * (j + 1))
        assert torch.equal(W["wte"][:, r], M["wte"])
        for t, p in ((0, 0), (2, 1)):
            assert torch.equal(W["blocks"][t]["q_w"][r, r], M["blocks"][p]["q_w"])
            assert torch.equal(W["blocks"][t]["fc_w"][r, f], M["blocks"][p]["fc_w"])
            assert torch.equal(W["blocks"][t]["pr_w"][f, r], M["blocks"][p]["pr_w"])
    if cross == "zero":
        assert W["blocks"][0]["q_w"][0:16, 16:32].abs().max() == 0
    g.growth_step(10)
    assert (logits(g, X) - logits(ms[0], X)).abs().max() > 1e-3  # the other members are in


def test_msg_members_needs_room_for_every_member():
    s = ModelShape.of(members(1)[0])
    with pytest.raises(GrowlmError, match="need width >= 48"):
        plan_chain(s, 3, "msg_members", n_embd=32, n_layer=4)


def test_linear_assignment_is_optimal():
    rng = np.random.default_rng(1)
    for n in (1, 2, 5, 7):
        c = rng.normal(size=(n, n))
        got = c[np.arange(n), linear_assignment(c)].sum()
        best = min(c[np.arange(n), list(p)].sum() for p in itertools.permutations(range(n)))
        assert got == pytest.approx(best)


def test_linear_assignment_matches_gpt2s_mlp_width_in_seconds():
    """Weight matching assigns GPT-2's 3072 MLP units once per block and iteration: a planted permutation of
    units with random weights is recovered exactly, in about 2 s on one core (the Hungarian method written
    in numpy that scipy's linear_sum_assignment replaced took minutes at this width)."""
    rng = np.random.default_rng(2)
    units = rng.normal(size=(3072, 64))
    perm = rng.permutation(3072)
    score = units @ units[perm].T  # unit i of m_1 against unit j of the permuted member
    assert (linear_assignment(-score) == np.argsort(perm)).all()


def test_merge_recovers_a_model_from_a_permuted_copy_of_itself():
    m = members(1, d=32)[0]
    gen = torch.Generator().manual_seed(5)
    res = torch.randperm(32, generator=gen)
    heads = [torch.randperm(4, generator=gen) for _ in range(2)]
    mlp = [torch.randperm(128, generator=gen) for _ in range(2)]
    twin = pack(permute(unpack(m), res, heads, mlp, 8), m.config)
    assert (logits(twin, X) - logits(m, X)).abs().max() < 1e-12  # a permutation changes no function
    assert not torch.equal(twin.transformer.h[0].mlp.c_fc.weight, m.transformer.h[0].mlp.c_fc.weight)
    merged = grow([m, twin], "merge", n_embd=32, n_layer=2)
    assert all(torch.equal(a, b) for a, b in zip(merged.parameters(), m.parameters()))
    naive = grow([m, twin], "merge", n_embd=32, n_layer=2, align="none")
    assert (logits(naive, X) - logits(m, X)).abs().max() > 1e-3
    grown = grow([m, twin], ["merge", "msg"], n_embd=64, n_layer=4, ramp_steps=5)
    assert (logits(grown, X) - logits(m, X)).abs().max() < 1e-12  # merge then exact msg


# ----------------------------------------------------------------------------------------------
# the refinement operators in the chain
# ----------------------------------------------------------------------------------------------

def test_refinement_operators_stand_in_a_chain_but_grow_nothing():
    s = ModelShape.of(members(1)[0])
    steps = plan_chain(s, 2, ["msg", "teach", "freeze"], n_embd=32, n_layer=4)
    assert [fused for fused, *_ in steps] == [["msg"]]
    with pytest.raises(GrowlmError, match="only refinement operators"):
        plan_chain(s, 2, ["teach"], n_embd=32, n_layer=4)
    with pytest.raises(GrowlmError, match="freeze needs inherited from the grow job, which only an operator affine"):
        plan_chain(s, 2, ["ligo", "freeze"], n_embd=32, n_layer=4)
    with pytest.raises(GrowlmError, match="carry needs moments from the grow job"):
        plan_chain(s, 2, ["mango", "carry"], n_embd=32, n_layer=4)
    assert OPERATORS["teach"].multi and not OPERATORS["freeze"].multi


def test_distill_loss_gradient_is_t_times_the_softmax_difference():
    gen = torch.Generator().manual_seed(0)
    z = torch.randn(2, 5, 11, generator=gen, dtype=torch.float64, requires_grad=True)
    t = torch.randn(2, 5, 11, generator=gen, dtype=torch.float64) * 3
    y = torch.randint(0, 11, (2, 5), generator=gen)
    temp, n = 2.5, 10
    kd = distill_loss(z, y, t, weight=1.0, temperature=temp)
    (grad,) = torch.autograd.grad(kd, z)
    expected = temp * (torch.softmax(z / temp, -1) - torch.softmax(t / temp, -1)) / n
    assert (grad.double() - expected).abs().max() < 1e-6  # (the loss is computed in fp32)
    ce = torch.nn.functional.cross_entropy(z.reshape(-1, 11), y.reshape(-1))
    assert distill_loss(z, y, t, weight=0.0, temperature=temp).item() == pytest.approx(ce.item())
    mixed = distill_loss(z, y, t, weight=0.3, temperature=temp)
    assert mixed.item() == pytest.approx(0.7 * ce.item() + 0.3 * kd.item(), rel=1e-5)


def _cfg(tmp, **kw):
    return TrainConfig(tokens=8 * 4 * T, batch_size=4, context=T, lr=3e-3, warmup_steps=1, eval_interval=2,
                       eval_tokens=4 * T, checkpoint_every=100, **{"dense_log_steps": 0, **kw})


def test_teachers_forward_flops_are_in_the_refinement_ledger(tmp_path):
    torch.manual_seed(0)
    ms = members(2, dtype=torch.float32)
    dirs = []
    for i, m in enumerate(ms):
        save_model(m, tmp_path / f"m{i}")
        dirs.append(str(tmp_path / f"m{i}"))
    tokens = learnable_tokens(V, 4000)
    student = grow(ms, "msg_members", n_embd=32, n_layer=4, ramp_steps=2)
    cfg = _cfg(tmp_path, refiners={"teach": dict(teachers=dirs, teach_weight=0.5, temperature=2.0, teach_steps=3)})
    summary = train(student, tokens, tokens, cfg, ckpt_dir=tmp_path / "ck", ledger_path=tmp_path / "ledger.csv",
                    log=lambda *_: None)
    per_token = model_train_flops_per_token(student.config, T)
    teacher = 2 * forward_flops_per_token(n_embd=16, n_layer=2, vocab_size=V, context=T)
    tps = 4 * T
    rows = list(csv.DictReader(open(tmp_path / "ledger.csv")))
    for r in rows:
        step = int(r["step"])
        assert int(float(r["flops"])) == step * tps * per_token + min(step, 3) * tps * teacher
    assert summary["teacher_flops"] == 3 * tps * teacher
    assert summary["refiner_flops"] == {"teach": 3 * tps * teacher}
    assert summary["flops"] == 8 * tps * per_token + 3 * tps * teacher


def test_teaching_changes_the_first_steps_only(tmp_path):
    ms = members(2, dtype=torch.float32)
    for i, m in enumerate(ms):
        save_model(m, tmp_path / f"m{i}")
    tokens = learnable_tokens(V, 4000)
    runs = {}
    teach = {"teach": dict(teachers=[str(tmp_path / "m0"), str(tmp_path / "m1")], teach_weight=0.9, teach_steps=2)}
    for name, kw in {"plain": {}, "teach": {"refiners": teach}}.items():
        model = grow(ms, "msg", n_embd=32, n_layer=4, ramp_steps=2)
        train(model, tokens, tokens, _cfg(tmp_path, dense_log_steps=8, **kw), ckpt_dir=tmp_path / f"ck_{name}",
              ledger_path=tmp_path / f"{name}.csv", log=lambda *_: None)
        runs[name] = [r for r in csv.DictReader(open(tmp_path / f"{name}.csv")) if r["train_loss"]]
    assert runs["plain"][0]["train_loss"] != runs["teach"][0]["train_loss"]  # step 1: the mixed loss


def test_freeze_holds_exactly_the_inherited_entries(tmp_path):
    ms = members(1, dtype=torch.float32)
    grown = grow(ms, "msg", n_embd=32, n_layer=4, ramp_steps=2, seed=1)
    masks = inherited_masks(ms, "msg", n_embd=32, n_layer=4, ramp_steps=2, seed=1)
    q = masks["inner.transformer.h.0.attn.c_attn.weight"]
    assert q[:16, :16].all() and not q[16:, :].any() and not q[:, 16:32].any()  # m_1's q block only
    assert not masks["inner.transformer.h.1.attn.c_attn.weight"].any()  # a new block
    assert masks["inner.transformer.wte.weight"][:, :16].all() and not masks["inner.transformer.wte.weight"][:, 16:].any()
    from safetensors.torch import save_file

    save_file({k: v.to(torch.uint8).contiguous() for k, v in masks.items()}, str(tmp_path / "inherited.safetensors"))
    before = {k: p.detach().clone() for k, p in grown.named_parameters()}
    cfg = _cfg(tmp_path, refiners={"freeze": dict(masks=str(tmp_path / "inherited.safetensors"), freeze_steps=8)})
    train(grown, learnable_tokens(V, 4000), learnable_tokens(V, 4000), cfg, ckpt_dir=tmp_path / "ck",
          ledger_path=tmp_path / "l.csv", log=lambda *_: None)
    for k, p in grown.named_parameters():
        assert torch.equal(p.detach()[masks[k]], before[k][masks[k]]), k
    moved = sum(int((p.detach() != before[k])[~masks[k]].sum()) for k, p in grown.named_parameters())
    assert moved > 1000  # the new entries trained


# ----------------------------------------------------------------------------------------------
# specialised members: clusters of books
# ----------------------------------------------------------------------------------------------

def test_book_clusters_are_disjoint_cover_every_book_and_balance_tokens():
    sizes = {"a": 900, "b": 500, "c": 400, "d": 300, "e": 250, "f": 100, "g": 50}
    start, sources = 0, {}
    for k, n in sizes.items():
        sources[k] = [start, start + n]
        start += n
    tokens = np.arange(start)
    for count in (2, 3, 4):
        parts = book_clusters(sources, count)
        names = [nm for p in parts for nm in p]
        assert sorted(names) == sorted(sizes) and len(set(names)) == len(names)
        totals = [sum(sizes[nm] for nm in p) for p in parts]
        assert max(totals) - min(totals) <= max(sizes.values())
        got = np.concatenate([cluster(tokens, sources, i, count) for i in range(count)])
        assert sorted(got.tolist()) == tokens.tolist()  # disjoint and covering, token for token
    assert book_clusters(sources, 2) == book_clusters(dict(reversed(list(sources.items()))), 2)
    with pytest.raises(GrowlmError, match="at least 8 sources"):
        book_clusters(sources, 8)


# ----------------------------------------------------------------------------------------------
# your own method: plugins
# ----------------------------------------------------------------------------------------------

GOOD = REPO / "examples" / "average_then_grow.py"


def test_the_tutorial_plugin_is_read_without_running_it_and_then_checked(tmp_path):
    spec = describe(GOOD)[0]
    assert (spec.name, spec.axis, spec.exact, spec.multi, spec.ramps) == (
        "average_then_grow", "both", False, True, ("ramp_steps",))
    assert spec.options == {"ramp_steps": 100}
    assert declare([GOOD]) == ["average_then_grow"] and load_plugins([GOOD]) == ["average_then_grow"]
    check_operator("average_then_grow", str(GOOD), ["average_then_grow"], n=2, d0=16, L0=1, d1=32, L1=2,
                   head_dim=8)


@pytest.mark.parametrize("section,example", [("Your own method", GOOD),
                                             ("Your own refinement operator", REPO / "examples" / "smooth_labels.py")])
def test_the_documented_tutorial_is_the_example_file(section, example):
    """The manual's tutorial code (docs/methods.md, "Your own method" and "Your own refinement
    operator") is the example file's (which the tests run)."""
    import re

    text = (REPO / "docs" / "methods.md").read_text()
    block = re.search(rf"^#+ {section}\n.*?```python\n(.*?)```", text, flags=re.S | re.M).group(1)
    code = [ln for ln in block.splitlines() if ln.strip() and not ln.strip().startswith('"""')]
    lines = example.read_text().splitlines()
    assert len(code) >= 8 and all(ln in lines for ln in code), [ln for ln in code if ln not in lines]


def test_a_plugin_check_says_it_runs_and_runs_once_for_the_same_files(tmp_path, capfd):
    """The check before the first job (Snakemake's onstart) says that it runs before it imports the
    plugins (a plugin may be slow), and a check that passed is not run again while the plugin files are
    the same: the run after it goes straight to its jobs. A changed file is checked again."""
    import copy

    import yaml
    from snakemake.utils import update_config, validate

    from growlm.validate import check_config, check_plugin_operators

    plugin, marker = tmp_path / "average_then_grow.py", tmp_path / "imported"
    plugin.write_text(f"open({str(marker)!r}, 'a').write('x')  # each import of the plugin, counted\n"
                      + GOOD.read_text())
    schema = REPO / "workflow" / "schemas" / "config.schema.yaml"
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    update_config(config, yaml.safe_load(TINY.read_text()))
    update_config(config, {"methods": ["average_then_grow"], "grow": {"plugins": [str(plugin)]}})
    sweep = check_config(config, schema, resolve_source=lambda s: REPO / "workflow/resources/corpus" / s["bundled"],
                         fill_defaults=lambda c: validate(c, str(schema)))
    spec = tmp_path / "results" / "plugins" / "check.json"

    def check() -> tuple[str, str]:
        said = check_plugin_operators(copy.deepcopy(config), sweep, spec)
        return said, capfd.readouterr().err

    said, err = check()
    assert err.startswith(f"growlm: checking the plugin operators of {plugin} on small random members") and said
    assert marker.read_text() == "x"
    again, err = check()
    assert again == f"{said} (checked before, on the same files)" and err == "" and marker.read_text() == "x"
    plugin.write_text(plugin.read_text() + "# edited\n")
    third, err = check()
    assert third == said and "checking the plugin operators" in err and marker.read_text() == "xx"


SMOOTH = REPO / "examples" / "smooth_labels.py"


def test_refinement_operators_are_described_once_and_implemented_as_described():
    """Every refinement operator of growlm.methods has a registered Refiner whose options (its
    __init__'s keyword-only parameters but its inputs) are the description's; a class that differs is
    refused when it registers."""
    from growlm.refiners import REFINERS, Refiner, options_of, refiner

    described = {n for n, spec in OPERATORS.items() if spec.axis == "refine"}
    assert described == set(REFINERS) == {"teach", "freeze", "carry"}
    for name in described:
        assert options_of(REFINERS[name]) == OPERATORS[name].options, name
        assert set(OPERATORS[name].ramps) <= set(OPERATORS[name].options)

    class Wrong(Refiner):
        def __init__(self, *, teach_steps: int = 100):
            pass

    with pytest.raises(GrowlmError, match="differ from its description"):
        refiner("teach")(Wrong)


def test_a_plugin_refiner_is_read_without_running_it_registered_and_trains(tmp_path):
    """examples/smooth_labels.py: described from its source (options, ramps, summary), registered when
    imported, and in a training run it changes the loss of its steps only, at no FLOPs."""
    from growlm.refiners import REFINERS

    spec = describe(SMOOTH)[0]
    assert (spec.name, spec.axis, spec.ramps, spec.options) == (
        "smooth_labels", "refine", ("smooth_steps",), {"smooth_steps": 100, "smoothing": 0.1})
    assert spec.summary.startswith("Cross entropy with smoothed targets")
    assert declare([SMOOTH]) == ["smooth_labels"] and load_plugins([SMOOTH]) == ["smooth_labels"]
    assert REFINERS["smooth_labels"].__name__ == "SmoothLabels" and OPERATORS["smooth_labels"].source == str(SMOOTH)
    assert growth_names(["msg", "smooth_labels"]) == ["msg"]
    tokens = learnable_tokens(V, 4000)
    runs = {}
    for name, kw in {"plain": {}, "smooth": {"refiners": {"smooth_labels": {"smooth_steps": 2, "smoothing": 0.3}}}
                     }.items():
        model = grow(members(1, dtype=torch.float32), "msg", n_embd=32, n_layer=4, ramp_steps=2)
        summary = train(model, tokens, tokens, _cfg(tmp_path, dense_log_steps=8, **kw), ckpt_dir=tmp_path / f"c{name}",
                        ledger_path=tmp_path / f"{name}.csv", log=lambda *_: None)
        runs[name] = ([r["train_loss"] for r in csv.DictReader(open(tmp_path / f"{name}.csv")) if r["train_loss"]],
                      summary["flops"])
    (plain, plain_flops), (smooth, smooth_flops) = runs["plain"], runs["smooth"]
    assert smooth[0] != plain[0] and smooth_flops == plain_flops


@pytest.mark.parametrize("body,problem", [
    ("def f(:\n    pass\n", r"broken\.py, line 1: syntax error"),
    ("def f(models, *, n_embd, n_layer, n_head=None, seed=0):\n    return models[0]\n", "defines no growth operator"),
    ("from growlm.growth import register_operator\nK = 3\n"
     "@register_operator('bad_k', axis='width', exact=False)\ndef f(models, *, n_embd, n_layer, n_head=None, seed=0, "
     "k=K):\n    return models[0]\n", "the default of k must be a literal"),
    ("from growlm.growth import register_operator\n"
     "@register_operator('bad_axis', exact=True)\ndef f(models, *, n_embd, n_layer, n_head=None, seed=0):\n"
     "    return models[0]\n", r"needs axis="),
    ("from growlm.growth import register_operator\n"
     "@register_operator('msg', axis='both', exact=True)\ndef f(models, *, n_embd, n_layer, n_head=None, seed=0):\n"
     "    return models[0]\n", "described twice"),
])
def test_a_broken_plugin_is_named_with_its_problem(tmp_path, body, problem):
    path = tmp_path / "broken.py"
    path.write_text(body)
    with pytest.raises(GrowlmError, match=problem) as err:
        declare([path])
    assert "broken.py" in str(err.value)


def test_wrong_shape_and_false_exactness_are_caught_before_training(tmp_path):
    path = tmp_path / "liar.py"
    path.write_text(
        "from growlm.growth import grow, register_operator\n"
        "@register_operator('too_small', axis='both', exact=False)\n"
        "def too_small(models, *, n_embd, n_layer, n_head=None, seed=0):\n"
        "    return models[0]\n"
        "@register_operator('not_exact', axis='both', exact=True)\n"
        "def not_exact(models, *, n_embd, n_layer, n_head=None, seed=0, noise: float = 0.5):\n"
        "    return grow(models[:1], 'net2net', n_embd=n_embd, n_layer=n_layer, seed=seed, noise=noise)\n")
    declare([path])
    load_plugins([path])
    with pytest.raises(GrowlmError, match=r"liar\.py: operator 'too_small'.*width 16 and depth 1, not 32 and 2"):
        check_operator("too_small", str(path), ["too_small"], n=1, d0=16, L0=1, d1=32, L1=2, head_dim=8)
    with pytest.raises(GrowlmError, match="declared exact=True, but at step 0 its logits differ from m_1's"):
        check_operator("not_exact", str(path), ["not_exact"], n=1, d0=16, L0=1, d1=32, L1=1, head_dim=8)


def test_a_plugin_that_returns_the_wrong_width_in_a_chain_is_named_not_the_operator_after_it(tmp_path):
    """A width operator that returns its member unchanged, chained before zero_block: the check names the
    plugin and the width its step asked for, not zero_block, which would only stop on the width it was given."""
    path = tmp_path / "narrow.py"
    path.write_text(
        "from growlm.growth import register_operator\n"
        "@register_operator('too_narrow', axis='width', exact=False)\n"
        "def too_narrow(models, *, n_embd, n_layer, n_head=None, seed=0):\n"
        "    return models[0]\n")
    declare([path])
    load_plugins([path])
    with pytest.raises(GrowlmError) as err:
        check_operator("too_narrow", str(path), ["too_narrow", "zero_block"], n=1, d0=16, L0=1, d1=32, L1=2,
                       head_dim=8)
    assert str(err.value).endswith("too_narrow returned a model of width 16 and depth 1, not 32 and 1 (what its step "
                                   "of too_narrow+zero_block asks for)"), err.value
    assert "zero_block keeps" not in str(err.value)


@pytest.mark.slow
def test_plugins_and_a_shared_trunk_run_compared_and_costed_through_one_tiny_workflow(tiny2_run, tmp_path):
    """One tiny workflow, two subjects (one run, to keep the suite short: the experiment tiny2 of
    tests/conftest.py, made beside the tiny one):

    - the tutorial's operator (refined with teachers) and refiner: grown, refined, compared (members
      counted) and reported like built-in methods; a broken plugin stops the run before any job, naming
      the file;
    - members.trunk: one trunk trained once on all of the members' text, each member branching from it on
      its own cluster of books; [merge, msg] aligns and averages the branches and grows them. The trunk is
      paid for once in the comparison, by every arm that uses the members."""
    wd = copy_workflow(tmp_path / "wf")  # with examples/
    overlay = wd / "tiny2.yaml"
    overlay.write_text(TINY2)
    (wd / "examples" / "broken.py").write_text(
        "from growlm.growth import register_operator\n"
        "@register_operator('broken_op', axis='both', exact=False)\n"
        "def broken_op(models, *, n_embd, n_layer, n_head=None, seed=0):\n"
        "    return models[0]\n")
    bad = tmp_path / "bad.yaml"
    bad.write_text("methods: [broken_op]\ngrow: {plugins: [examples/broken.py]}\n")
    proc = run_snakemake(wd, "--cores", "2", "--configfile", str(TINY), str(overlay), str(bad), check=False)
    assert proc.returncode != 0
    assert "examples/broken.py" in proc.stderr and "width 16 and depth 1, not 32 and 2" in proc.stderr
    assert not (wd / "results" / "tiny2" / "models").exists()  # nothing trained

    wd = tiny2_run  # the same overlay run to its end
    rows = {r["method"]: r for r in csv.DictReader(open(wd / "results/tiny2/eval/comparison.csv"))}
    assert set(rows) == {"merge+msg", "average_then_grow+teach", "msg+smooth_labels"}

    # the plugins (the operator's arm also refines with teachers: both use the two members)
    assert int(rows["average_then_grow+teach"]["members_used"]) == 2
    # teachers alone make an arm use every member, after a single-source operator too (the comparison's
    # members_used; the grow and refine jobs of such an arm: tests/test_branches.py, in-process)
    assert members_used(["msg", "teach"], 2) == 2 and members_used("msg", 2) == 1
    # counted as a built-in arm of the same members is
    assert float(rows["average_then_grow+teach"]["small_flops"]) == float(rows["merge+msg"]["small_flops"]) > 0
    growth = json.loads(next((wd / "results/tiny2/models/grown/average_then_grow+teach").rglob("growth.json"))
                        .read_text())
    assert growth["chain"] == ["average_then_grow", "teach"]
    refined = json.loads(next((wd / "results/tiny2/models/refined/average_then_grow+teach").rglob("growlm.json"))
                         .read_text())
    assert refined["train"]["teacher_flops"] > 0
    # the plugin refiner: loaded by the refine job from the plugin file its grow job recorded
    smoothed = json.loads(next((wd / "results/tiny2/models/refined/msg+smooth_labels").rglob("growlm.json"))
                          .read_text())
    assert smoothed["refiners"]["smooth_labels"]["smoothing"] == 0.1 and smoothed["refiners"]["smooth_labels"][
        "smooth_steps"] > 0

    # the shared trunk
    trunk = wd / "results/tiny2/models/trunk/d16_L1/s0"
    trunk_meta = json.loads((trunk / "growlm.json").read_text())
    members = [json.loads((wd / f"results/tiny2/models/small/d16_L1/s0/m{i}/growlm.json").read_text()) for i in (1, 2)]
    assert all(m["init_from"] == "results/tiny2/models/trunk/d16_L1/s0" for m in members)
    assert [m["shard"]["index"] for m in members] == [0, 1]
    assert trunk_meta["train"]["tokens"] + members[0]["train"]["tokens"] <= 12000  # half the budget each
    # a branch starts where the trunk ended: its first evaluation is the trunk's last
    trunk_last = list(csv.DictReader(open(trunk / "ledger.csv")))[-1]["val_loss"]
    first = list(csv.DictReader(open(wd / "results/tiny2/models/small/d16_L1/s0/m1/ledger.csv")))[0]
    assert first["step"] == "0" and first["val_loss"] == trunk_last
    assert int(rows["merge+msg"]["members_used"]) == 2
    for row in rows.values():  # the trunk once, then the branches the arm uses (msg alone: m_1)
        used = int(row["members_used"])
        assert used == (1 if row["method"] == "msg+smooth_labels" else 2)
        expected = trunk_meta["train"]["flops"] + sum(m["train"]["flops"] for m in members[:used])
        assert float(row["small_flops"]) == pytest.approx(expected)
