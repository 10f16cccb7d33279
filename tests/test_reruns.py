"""What a rule declares is what its job reads: for every key of the config schema, changing it reruns
exactly the jobs whose params hold it (or whose outputs it renames).

The check builds the workflow's DAG with Snakemake's own API twice, for a base experiment and for the
base with one key changed, and compares every job's params as Snakemake records them for its rerun
trigger (`persistence._params`) and its set of input files (the "input" trigger): a job reruns
exactly when one of these differs, and runs anew when its outputs are new (a sweep value is in the
path). The base holds one job of every kind
(members on shards, msg, a combining chain, a learned operator, both schedules, profiling), so every
key has its readers in it. The entry scripts pass nothing but their rule's params, inputs, outputs,
wildcards, threads and resources to the library, so "params" is everything a job reads.
`tests/test_workflow.py` shows on a finished run that Snakemake then really reruns these jobs.
"""

from __future__ import annotations

import functools

import pytest
import yaml

from conftest import REPO, TINY, copy_workflow

BASE = """
L1: [4]
methods: [msg, [concat, lemon, zero_block], ligo, vcycle, apollo]
members: {data: shards, shards: 2}
grow: {options: {ligo: {steps: 2}}}
profile: {tools: [nsys, ncu]}
vcycle: {coarse_share: 0.3}
apollo: {share: 0.3}
"""

TRAINING = {"train_small", "train_baseline", "refine"}
SMALL_PROFILE = {"train_small", "profile"}  # the profiled member reads the members' settings
SWEEP_NEW = {"grow", "refine", "evaluate_model"}  # a new sweep value: new jobs (paths name the value)
SWEPT = {"compare", "plans_table"}  # read every model of the sweep: a new model is a new input
SWEPT_PROFILED = {*SWEPT, "profile"}  # ... and the profiled models are the first combination's

EVERY = "every rule"  # an experiment's name is its folder: every job of another name is a new job

# key -> (the change, as a YAML overlay; rules whose params change; rules with new jobs)
TABLE = {
    "experiment": ("experiment: other", set(), EVERY),
    "d0": ("d0: [8]", SWEPT_PROFILED, {"train_small", "evaluate_ensemble", *SWEEP_NEW}),
    "L0": ("L0: [2]", SWEPT_PROFILED, {"train_small", "evaluate_ensemble", *SWEEP_NEW}),
    "d1": ("d1: [48]", SWEPT_PROFILED, {"train_baseline", *SWEEP_NEW}),
    "L1": ("L1: [2]", SWEPT_PROFILED, {"train_baseline", *SWEEP_NEW}),
    "n": ("n: [1]", SWEPT_PROFILED, {"evaluate_ensemble", *SWEEP_NEW}),
    "n_members": ("n_members: 1", SWEPT_PROFILED, {"evaluate_ensemble", *SWEEP_NEW}),
    "seeds": ("seeds: [1]", SWEPT_PROFILED, {"train_small", "train_baseline", "evaluate_ensemble",
                                                     *SWEEP_NEW}),
    # growth is shared across budgets: a new budget list touches no grow job
    # (the V-cycle's stages are shares of the shortest budget's steps at the first rate: its grow job reads them)
    "budgets": ("budgets: [20000]", {*SWEPT, "grow"}, {"train_baseline", "refine", "evaluate_model"}),
    "lrs": ("lrs: [0.002]", {*SWEPT, "grow"}, {"train_baseline", "refine", "evaluate_model"}),
    # a weight decay other than train.weight_decay is named in the large runs' paths (growlm.experiment.optim_id):
    # new M_0 and refinement jobs; the schedules' grow jobs keep train.weight_decay
    "weight_decays": ("weight_decays: [0.05]", SWEPT, {"train_baseline", "refine", "evaluate_model"}),
    "methods": ("methods: [msg, [concat, lemon, zero_block], ligo, vcycle, apollo, lemon]", SWEPT, SWEEP_NEW),
    "model.head_dim": ("model: {head_dim: 4}", {"train_small", "train_baseline", "grow", "profile"}, set()),
    # the family and its settings are model settings: the models built from scratch and the schedules
    "model.family": ("model: {family: llama}", {"train_small", "train_baseline", "grow", "profile"}, set()),
    "model.heads_per_kv": ("model: {family: llama, heads_per_kv: 1}", {"train_small", "train_baseline", "grow",
                                                                        "profile"}, set()),
    "model.mlp_ratio": ("model: {family: llama, mlp_ratio: 2}", {"train_small", "train_baseline", "grow", "profile"},
                        set()),
    "model.attention_bias": ("model: {family: llama, attention_bias: true}", {"train_small", "train_baseline", "grow",
                                                                             "profile"}, set()),
    "model.context": ("model: {context: 16}", {*TRAINING, "fit_tokenizer", "grow", "evaluate_model",
                                               "evaluate_ensemble", "profile"}, set()),
    "model.tie_embeddings": ("model: {tie_embeddings: false}", {"train_small", "train_baseline", "grow", "profile"},
                             set()),
    "corpus.val_fraction": ("corpus: {val_fraction: 0.06}", {"prepare_source"}, set()),
    "corpus.test_fraction": ("corpus: {test_fraction: 0.06}", {"prepare_source"}, set()),
    "corpus.min_words": ("corpus: {min_words: 4}", {"prepare_source"}, set()),
    "corpus.max_words": ("corpus: {max_words: 50}", {"prepare_source"}, set()),
    "corpus.threads": ("corpus: {threads: 1}", set(), set()),  # how fast, not what
    "corpus.mirror": ("corpus: {mirror: .}", set(), set()),  # where a checked download comes from, not what
    "corpus.sources": ("corpus: {sources: [{name: pg14642_mcguffey_eclectic_primer, level: 0, bundled: "
                       "pg14642_mcguffey_eclectic_primer.txt}, {name: pg68545_aldine_second_reader, level: 1, "
                       "bundled: pg68545_aldine_second_reader.txt}]}", {"build_level"}, set()),
    # the members' training set: one level's file, or several levels' files one after another
    "levels.members": ("levels: {members: [0, 1]}", {"train_small", "profile", "compare"}, {"mix_levels"}),
    "levels.large": ("levels: {large: [1, 0]}", {"train_baseline", "refine", "grow", "profile", "compare"},
                     {"mix_levels"}),
    "levels.evaluate": ("levels: {evaluate: 0}", {"compare"}, set()),
    "tokenizer.vocab_size": ("tokenizer: {vocab_size: 600}", {"fit_tokenizer", "compare"}, set()),
    "tokenizer.min_frequency": ("tokenizer: {min_frequency: 3}", {"fit_tokenizer"}, set()),
    "members.data": ("members: {data: seed}", {"train_small"}, set()),
    "members.shards": ("members: {shards: 3}", {"train_small"}, set()),
    # members you already have: imported (not trained), their tokenizer the experiment's, M_0 built like them
    "members.pretrained": ("members: {pretrained: [pm/m1, pm/m2], data: seed}",
                           {"compare", "evaluate_ensemble", "grow", "plans_table", "profile", "profile_report",
                            "train_baseline"}, {"evaluate_model", "import_member", "member_part", "member_tokenizer"}),
    "members.cost": ("members: {cost: {tokens: 5}}", set(), set()),  # a pretrained member's: none here
    # the members branch from a trunk trained once: their budget (params) and their inputs change
    "members.trunk": ("members: {trunk: 0.5}", {"train_small"}, {"train_trunk"}),
    # growth before the decay needs wsd members (whose jobs then keep that model too: an output more, which the
    # comparison asks for); the grow jobs read it (inputs and params), the annealed members are evaluated as before
    "members.source": ("{train: {small: {schedule: wsd}}, members: {source: before_decay}}",
                       {"train_small", "grow", "profile", "compare"}, set()),
    # the members' budget as a share of M_0's FLOPs: their tokens (params) change
    "members.flops_share": ("members: {flops_share: 0.05}", SMALL_PROFILE, set()),
    "train.small.tokens": ("train: {small: {tokens: 14000}}", SMALL_PROFILE, set()),
    "train.small.lr": ("train: {small: {lr: 0.002}}", SMALL_PROFILE, set()),
    "train.small.batch_size": ("train: {small: {batch_size: 4}}", SMALL_PROFILE, set()),
    "train.small.warmup_steps": ("train: {small: {warmup_steps: 4}}", SMALL_PROFILE, set()),
    "train.large.tokens": ("train: {large: {tokens: 20000}}", {*SWEPT_PROFILED, "grow"},
                           {"train_baseline", "refine", "evaluate_model"}),
    "train.large.lr": ("train: {large: {lr: 0.002}}", {*SWEPT_PROFILED, "grow"},
                       {"train_baseline", "refine", "evaluate_model"}),
    "train.large.batch_size": ("train: {large: {batch_size: 4}}", {"train_baseline", "refine", "grow", "profile"},
                               set()),  # grow: ligo's level-1 batches and the schedules
    "train.large.warmup_steps": ("train: {large: {warmup_steps: 4}}", {"train_baseline", "grow", "profile"}, set()),
    "train.refine.batch_size": ("train: {refine: {batch_size: 4}}", {"refine", "profile"}, set()),
    "train.refine.warmup_steps": ("train: {refine: {warmup_steps: 2}}", {"refine", "profile"}, set()),
    "train.refine.decay_share": ("train: {refine: {decay_share: 0.5}}", {"refine", "profile"}, set()),
    # a stage's schedule: a wsd member keeps its model where its decay begins (an output more, which the comparison
    # asks for); the refinement follows train.large's unless it sets its own; the V-cycle's stages keep their cosine
    # (their grow job stays); a wsd large job keeps its states for its cooldown branches (outputs more) and each
    # branch is a job, which the comparison reads
    "train.small.schedule": ("train: {small: {schedule: wsd}}", {"train_small", "profile", "compare"}, set()),
    "train.large.schedule": ("train: {large: {schedule: wsd}}", {"train_baseline", "refine", "profile", "compare"},
                             {"cooldown_baseline", "cooldown_refine"}),
    "train.refine.schedule": ("train: {refine: {schedule: wsd}}", {"refine", "profile", "compare"}, {"cooldown_refine"}),
    "train.schedule": ("train: {schedule: wsd}", {"train_small", "train_baseline", "refine", "profile", "compare"},
                       {"cooldown_baseline", "cooldown_refine"}),
    # read by wsd runs only: the base's cosine runs rerun for neither
    "train.wsd_decay": ("train: {wsd_decay: 0.3}", set(), set()),
    "train.wsd_shape": ("train: {wsd_shape: linear}", set(), set()),
    # the cooldown branches' points: under wsd only (the base's cosine runs have none)
    "train.branches": ("train: {branches: [0.5]}", set(), set()),
    "train.refine.branches": ("train: {refine: {branches: [0.5]}}", set(), set()),
    # M_0 past its budget needs wsd (refused under the cosine): its job's budget changes with its schedule, and
    # its cooldowns at 1 and 1.5 are jobs more
    "baseline.extend": ("{train: {large: {schedule: wsd}}, baseline: {extend: 2}}",
                        {"train_baseline", "refine", "profile", "compare"}, {"cooldown_baseline", "cooldown_refine"}),
    # read by the report's first page alone (the trend's prediction)
    "predict.params": ("predict: {params: 1.0e+8, tokens_per_param: 20}", {"report_figures"}, set()),
    "predict.tokens_per_param": ("predict: {params: 1.0e+6, tokens_per_param: 8}", {"report_figures"}, set()),
    "train.min_lr_ratio": ("train: {min_lr_ratio: 0.2}", {*TRAINING, "grow", "profile"}, set()),
    "train.weight_decay": ("train: {weight_decay: 0.05}", {*TRAINING, "grow", "profile"}, set()),
    "train.grad_clip": ("train: {grad_clip: 0.5}", {*TRAINING, "grow", "profile"}, set()),
    "train.eval_interval": ("train: {eval_interval: 10}", {*TRAINING, "grow", "profile"}, set()),
    "train.eval_tokens": ("train: {eval_tokens: 1024}", {*TRAINING, "grow", "profile"}, set()),
    "train.final_eval_tokens": ("train: {final_eval_tokens: 4096}", {*TRAINING, "grow", "profile"}, set()),
    "train.checkpoint_every": ("train: {checkpoint_every: 20}", {*TRAINING, "grow", "profile"}, set()),
    "train.dense_log_steps": ("train: {dense_log_steps: 4}", {"refine", "profile"}, set()),
    # how the steps run, which changes the last digits of every loss (the order of floating-point sums) but not
    # what is computed: by choice they rerun nothing (rounding far below the seeds' spread is no reason to retrain
    # an experiment), and each job records the mode it computed in instead (growlm.modes: its ledger, growlm.json,
    # the comparison's m0_mode/m1_mode and the report, which says when the models were not all in one mode)
    "train.threads": ("train: {threads: 2}", set(), set()),  # the jobs' threads, not a param
    "train.compile": ("train: {compile: true}", set(), set()),  # params.how, derived from resources
    "train.compile_ramps": ("train: {compile_ramps: true}", set(), set()),  # ditto
    "train.sync_every": ("train: {sync_every: 5}", set(), set()),  # how often losses are read: ditto
    "train.log_to": ("train: {log_to: []}", set(), set()),  # where live curves go (params.live, derived)
    "controls.single_member": ("controls: {single_member: false}", SWEPT, set()),  # controls removed
    "controls.ensemble": ("controls: {ensemble: false}", {"compare"}, set()),
    "vcycle.levels": ("vcycle: {levels: 3}", {"grow"}, set()),
    "vcycle.factor": ("vcycle: {factor: 4}", {"grow"}, set()),
    "vcycle.pairing": ("vcycle: {pairing: adjacent}", {"grow"}, set()),
    "vcycle.stage_share": ("vcycle: {stage_share: 0.1}", {"grow"}, set()),
    "vcycle.coarse_share": ("vcycle: {coarse_share: 0.4}", {"grow"}, set()),
    "vcycle.lr_multiplier": ("vcycle: {lr_multiplier: 2}", {"grow"}, set()),
    "vcycle.alpha": ("vcycle: {alpha: 0.4}", {"grow"}, set()),
    "vcycle.embeddings": ("vcycle: {embeddings: sum}", {"grow"}, set()),
    "vcycle.final_share": ("vcycle: {final_share: 0.4}", {"refine"}, set()),  # the V-cycle's refinement only
    "vcycle.final_warmup": ("vcycle: {final_warmup: 0.1}", {"refine"}, set()),
    "apollo.share": ("apollo: {share: 0.2}", {"grow"}, set()),
    "apollo.tokens": ("apollo: {tokens: 9000}", {"grow"}, set()),
    "apollo.stages": ("apollo: {stages: equal}", {"grow"}, set()),
    "apollo.final_share": ("apollo: {final_share: 0.5}", {"refine"}, set()),  # Apollo's refinement only
    "apollo.final_warmup": ("apollo: {final_warmup: 0.1}", {"refine"}, set()),
    "apollo.lr": ("apollo: {lr: 0.001}", {"grow"}, set()),
    "apollo.warmup_steps": ("apollo: {warmup_steps: 5}", {"grow"}, set()),
    "grow.options": ("grow: {options: {msg: {ramp_steps: 5}}}", {"grow", "refine"}, set()),  # refine: its ramp
    # a plugin reruns only the grow jobs of methods that use its operators (none in the base)
    "grow.plugins": ("grow: {plugins: [examples/average_then_grow.py]}", set(), set()),
    # ncu's jobs go, nsys's stay as they are; the profile page is made again without ncu's tables
    "profile.tools": ("profile: {tools: [nsys]}", {"profile_report"}, set()),
    "profile.warmup_steps": ("profile: {warmup_steps: 2}", {"profile"}, set()),
    "profile.steps": ("profile: {steps: 4}", {"profile"}, set()),
    "profile.ncu_kernel_filter": ("profile: {ncu_kernel_filter: gemm}", {"profile"}, set()),
    "profile.ncu_launch_count": ("profile: {ncu_launch_count: 5}", {"profile"}, set()),
    "evaluate.test_tokens": ("evaluate: {test_tokens: 2048}", {"evaluate_model", "evaluate_ensemble"}, set()),
    # a task adds its own jobs (one per model) and its scores to the comparison and the first page
    "evaluate.tasks": ("evaluate: {tasks: [growlm_cloze]}", {"compare", "report_figures"},
                       {"cloze_task", "evaluate_tasks", "report_tasks"}),
    "evaluate.task_limit": ("evaluate: {task_limit: 5}", set(), set()),  # read by task jobs only (none in the base)
    "resources.gpu": ("resources: {gpu: 1}", set(), set()),  # what the scheduler gives, not what is computed
    "resources.nodes": ("resources: {nodes: 2}", set(), set()),  # where a job runs (params.how), not what
    "resources.cpus_per_gpu": ("resources: {cpus_per_gpu: 2}", set(), set()),
    "resources.mem_mb": ("resources: {mem_mb: 2000}", set(), set()),
    "resources.runtime": ("resources: {runtime: 30}", set(), set()),
    "resources.memory_limit_gb": ("resources: {memory_limit_gb: 8}", {*TRAINING, "grow"}, set()),  # the plan
    "resources.gpu_share": ("resources: {gpu_share: 0.5}", set(), set()),  # what the scheduler gives (params.how)
}


def schema_keys() -> set[str]:
    """Every leaf key of the config schema (a train stage's keys counted per stage)."""
    schema = yaml.safe_load((REPO / "workflow" / "schemas" / "config.schema.yaml").read_text())
    defs = schema["$defs"]

    def walk(node, prefix):
        for key, sub in node.get("properties", {}).items():
            ref = sub.get("$ref", "").rpartition("/")[2]
            if ref in ("train_stage", "refine_stage"):
                yield from (f"{prefix}{key}.{k}" for k in defs[ref]["properties"])
            elif "properties" in sub:
                yield from walk(sub, f"{prefix}{key}.")
            else:
                yield f"{prefix}{key}"

    return set(walk(schema, ""))


def _pretrained_members(root):
    """Two GPT-2 members of the base's member shape, saved with a tokenizer (for members.pretrained)."""
    from growlm.model import build_model, save_model
    from growlm.tokenizer import fit_tokenizer, vocab_size

    fit_tokenizer([REPO / "workflow/resources/corpus/pg18735_little_red_hen.txt"], root / "tok", vocab_size=300)
    for i in (1, 2):
        model = build_model(seed=i, n_embd=16, n_layer=1, vocab_size=vocab_size(root / "tok"), n_positions=64,
                            head_dim=8)
        save_model(model, root / f"m{i}", tokenizer_dir=root / "tok")


@pytest.fixture(scope="module")
def dag_params(tmp_path_factory):
    """A function: what Snakemake records for each job's rerun triggers (its params and its set of
    input files), for the base with an overlay."""
    from snakemake.api import SnakemakeApi
    from snakemake.settings.types import ConfigSettings, DAGSettings, OutputSettings, Quietness, ResourceSettings

    wd = copy_workflow(tmp_path_factory.mktemp("reruns") / "wf")
    (wd / "base.yaml").write_text(BASE)
    _pretrained_members(wd / "pm")

    @functools.cache
    def params(overlay: str = "") -> dict:
        (wd / "change.yaml").write_text((overlay or "{}") + "\n")
        files = [wd / "config" / "config.yaml", TINY, wd / "base.yaml", wd / "change.yaml"]
        with SnakemakeApi(OutputSettings(quiet={Quietness.ALL})) as api:
            wf = api.workflow(resource_settings=ResourceSettings(cores=1), config_settings=ConfigSettings(
                configfiles=files), snakefile=wd / "workflow" / "Snakefile", workdir=wd)
            wf.dag(DAGSettings(targets={"all"})).execute_workflow(executor="dryrun")
            workflow = wf._workflow
            # `all` makes nothing: its inputs are the experiment's products, which every sweep key renames
            return {(job.rule.name, tuple(sorted(map(str, job.output)))):
                    (workflow.persistence._params(job), tuple(sorted(map(str, job.input))))
                    for job in workflow.dag.jobs if job.rule.name != "all"}

    return params


def test_the_table_covers_every_key_of_the_schema():
    assert set(TABLE) == schema_keys(), set(TABLE) ^ schema_keys()


def test_the_base_has_a_job_of_every_kind(dag_params):
    rules = {rule for rule, _ in dag_params()}
    assert {"train_small", "train_baseline", "grow", "refine", "evaluate_model", "evaluate_ensemble", "compare",
            "profile", "fit_tokenizer", "prepare_source", "build_level", "encode_split"} <= rules


def same_jobs(base: dict, new: dict) -> dict:
    """{job of `new`: the job of `base` of its rule that wrote any of its outputs, or None}. Snakemake keeps its
    records per output file, so a job whose outputs a change adds to is the same job, changed (not a new one)."""
    writer = {(job[0], out): job for job in base for out in job[1]}
    return {job: next((writer[job[0], out] for out in job[1] if (job[0], out) in writer), None) for job in new}


@pytest.mark.parametrize("key", sorted(TABLE))
def test_changing_a_key_reruns_exactly_its_readers(dag_params, key):
    """Every key reruns exactly the table's jobs; and an output that a change adds to a job is read by another
    job: Snakemake compares a job's params only when every output it declares has a record, and reruns a job for
    a missing output only when a job that runs asks for it, so an added output that nothing reads would leave
    the job as it was, whatever its params say."""
    overlay, want_changed, want_new = TABLE[key]
    base, new = dag_params(), dag_params(overlay)
    if want_new == EVERY:
        want_new = {job[0] for job in base} - want_changed
    old = same_jobs(base, new)
    changed = {job[0] for job, was in old.items() if was and (was != job or base[was] != new[job])}
    added = {job[0] for job, was in old.items() if not was}
    assert (changed, added) == (want_changed, want_new), key
    read = {f for inputs in (p[1] for p in new.values()) for f in inputs}
    gained = {out for job, was in old.items() if was for out in set(job[1]) - set(was[1])}
    assert gained <= read, (key, sorted(gained - read))


def test_reordered_keys_of_a_source_rerun_nothing(dag_params):
    """`{level, name, bundled}` is the same source as `{name, level, bundled}`."""
    sources = yaml.safe_load((REPO / "tests" / "config" / "tiny.yaml").read_text())["corpus"]["sources"]
    reordered = [dict(reversed(list(s.items()))) for s in sources]
    assert [list(s) for s in reordered] != [list(s) for s in sources]
    overlay = yaml.safe_dump({"corpus": {"sources": reordered}}, sort_keys=False)
    assert dag_params(overlay) == dag_params()


def test_a_longer_budget_touches_no_job_of_the_shorter_one(dag_params):
    """Adding a budget adds its own M_0 and refinements (and, with several budgets, the figure of the
    cost ratio against the budget); the grown models, the existing refinements (their mask ramps are
    a fifth of the shortest refinement, unchanged) and every other job stay."""
    base, new = dag_params(), dag_params("budgets: [24000, 48000]")
    changed = {job[0] for job, p in new.items() if job in base and base[job] != p}
    added = {job[0] for job in new if job not in base}
    assert changed == {"compare", "plans_table"}
    assert added == {"train_baseline", "refine", "evaluate_model", "budget_plot"}
    assert all(job in new for job in base)
