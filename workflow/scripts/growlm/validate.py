"""Checking an experiment before any job runs: every value, every combination, every source.

The workflow calls `check_config` while Snakemake parses the Snakefile (torch-free), at every run:

1. `coerce` (growlm.config_values): values given on the command line arrive as strings (`--config
   'model={head_dim: 32}'` gives '32') or as floats (`budgets=1e6`, `d0=64.0`); they are read as YAML and
   turned into the type the schema asks for, so a whole number written as a float is that number.
2. `schema_problems` (growlm.config_values): the JSON schema (`workflow/schemas/config.schema.yaml`), each
   problem as one line naming the key, the value and what would work (the allowed range or values, a
   close key name).
3. `experiment_problems` (here): what the schema cannot say: head sizes, sizes that growth cannot reach,
   every growth chain of the sweep with each operator's own constraints and option names
   (`growlm.methods`), ramps longer than the shortest refinement, budgets smaller than one batch,
   the V-cycle's factor, the reading levels each arm names, the sources, whose local data
   must exist and hold text (a Hub id is checked by the job that reads it), and the live-curve
   trackers of `train.log_to`, which must be installed, and `resources.gpu_share`, which must divide a GPU
   (`growlm.gpus.share_problem`). (The benchmark tasks of `evaluate.tasks`
   are checked against lm-evaluation-harness by the workflow, `growlm.tasks.task_problems`.)

All problems are reported together in one `GrowlmError`, one line each. What the corpus says about the
members' shards and what the sweep would cost are in `growlm.sizing` (its warnings come at the dry run).

The plugin operators of `grow.plugins` are checked later, before the first job (Snakemake's
`onstart`): `check_plugin_operators` grows tiny random members with each of them in a child Python
(`growlm.jobs.plugins`), so that neither torch nor the user's code is imported by Snakemake.
"""

from __future__ import annotations

import difflib
import hashlib
import itertools
import json
import subprocess
import sys
from pathlib import Path
from typing import Callable

import yaml

from growlm.config_values import coerce, coerce_options, schema_problems
from growlm.branches import branch_problems
from growlm.errors import GrowlmError, package_env
from growlm.experiment import (arm_levels, baseline_tokens, grow_settings, member_train, model_settings, normalise_sweep,
                               plugin_files, refine_settings, refine_steps, train_config, trunk_tokens)
from growlm.family_specs import FAMILY_SPECS, family_spec
from growlm.gpus import share_problem
from growlm import pretrained
from growlm.live import tracker_problems
from growlm.methods import (OPERATORS, check_options, is_schedule, method_chain, method_id, methods,
                            plan_chain, schedules)
from growlm.outputs import name_problems
from growlm.plugins import declare
from growlm.shape import ModelShape
from growlm.sizing import shard_problems, timing_problems
from growlm.sources import kind as sources_kind, local_files, mirror_folder
from growlm.train_config import TrainConfig

# ----------------------------------------------------------------------------------------------
# the experiment
# ----------------------------------------------------------------------------------------------

def _head_problems(config: dict, sweep: dict) -> list[str]:
    m = config["model"]
    head_dim = m["head_dim"]
    out = []
    spec = family_spec(m["family"])
    owners = {}  # the settings of other families that this one does not take: the first family that does
    for other in FAMILY_SPECS.values():
        for key in other.settings:
            if key not in spec.settings:
                owners.setdefault(key, other.name)
    for key, owner in owners.items():
        if m.get(key) is not None:
            out.append(f"model.{key} = {m[key]!r}: a setting of the {owner} family; {spec.name} has "
                       f"{spec.lacks or 'no such setting'} (set model.family: {owner}, or drop it)")
    own = {key: m.get(key) for key in spec.settings}
    r = own.get("heads_per_kv") or spec.settings.get("heads_per_kv", 1)
    ratio = own.get("mlp_ratio") or spec.settings.get("mlp_ratio")
    for key in ("d0", "d1"):
        for d in sweep[key]:
            if d % head_dim:
                up = (d // head_dim + 1) * head_dim
                out.append(f"{key} = {d}: not a multiple of model.head_dim = {head_dim} (every model has whole heads "
                           f"of that size); e.g. {key} = {up}")
            elif (d // head_dim) % r:
                out.append(f"{key} = {d}: {d // head_dim} heads are not whole groups of model.heads_per_kv = {r} query "
                           f"heads per key/value head; use a width that is a multiple of {head_dim * r}")
            if ratio is not None and abs(ratio * d - round(ratio * d)) > 1e-9:
                out.append(f"{key} = {d}: model.mlp_ratio = {ratio} gives {ratio * d:g} MLP units, not a whole number; "
                           f"choose a ratio that does at every width of the sweep")
    return out


def _size_problems(sweep: dict) -> list[str]:
    out = []
    for d0, d1 in itertools.product(sweep["d0"], sweep["d1"]):
        if d1 < d0:
            out.append(f"d1 = {d1}: smaller than d0 = {d0}; the grown model must be at least as wide (d1 >= {d0})")
    for L0, L1 in itertools.product(sweep["L0"], sweep["L1"]):
        if L1 < L0:
            out.append(f"L1 = {L1}: smaller than L0 = {L0}; the grown model must be at least as deep (L1 >= {L0})")
    return out


def _suggest_width(shape: ModelShape, n: int, method, d1: int, L1: int, head_dim: int) -> str:
    """'d1 = 96 would work' for the smallest width above d1 the chain reaches, if any within 8 x."""
    for width in range(d1 + head_dim, 8 * max(d1, shape.d) + 1, head_dim):
        try:
            plan_chain(shape, n, method, n_embd=width, n_layer=L1)
        except GrowlmError:
            continue
        return f"; d1 = {width} would work"
    return ""


def _method_problems(config: dict, sweep: dict) -> list[str]:
    out = []
    known = [*methods(), *schedules()]
    options = config["grow"]["options"]
    for name in options:
        if name not in OPERATORS or is_schedule(name):
            near = difflib.get_close_matches(name, known, n=1)
            out.append(f"grow.options.{name}: no growth operator of that name"
                       + (f"; did you mean {near[0]!r}?" if near else f" (known: {', '.join(methods())})"))
    for m in sweep["methods"]:
        chain = method_chain(m)
        for name in chain:
            if is_schedule(name) and len(chain) > 1:
                out.append(f"methods: {m}: {name} is a training schedule and cannot be chained; list it alone")
            elif name not in OPERATORS:
                near = difflib.get_close_matches(name, known, n=1)
                out.append(f"methods: {m}: unknown growth method {name!r}"
                           + (f"; did you mean {near[0]!r}?" if near else "") + f" (known: {', '.join(known)})")
    if out:
        return out
    head_dim = config["model"]["head_dim"]
    for m in sweep["methods"]:
        chain = method_chain(m)
        if is_schedule(chain[0]):
            continue
        family = config["model"]["family"]
        for name in chain:
            if name in OPERATORS and not OPERATORS[name].works_on(family):
                out.append(f"methods: {method_id(m)}: {name} works on {', '.join(OPERATORS[name].families)} models, "
                           f"not {family} (model.family); choose another method or family")
        configured = {k: v for name in chain for k, v in (options.get(name) or {}).items()}
        try:
            check_options(chain, configured)
        except GrowlmError as err:
            out.append(f"grow.options for {method_id(m)}: {err}")
        if "batches" in configured:
            out.append(f"grow.options for {method_id(m)}: batches are drawn by growlm from the level-1 training "
                       f"split; set steps instead")
        for d0, L0, d1, L1, n in itertools.product(sweep["d0"], sweep["L0"], sweep["d1"], sweep["L1"], sweep["n"]):
            if d0 % head_dim or d1 % head_dim or d1 < d0 or L1 < L0 or _head_problems(config, sweep):
                continue  # said above
            shape = ModelShape.of({**model_settings(config, n_embd=d0, n_layer=L0),
                                   "vocab_size": config["tokenizer"]["vocab_size"]})
            try:
                plan_chain(shape, n, chain if len(chain) > 1 else chain[0], n_embd=d1, n_layer=L1)
            except GrowlmError as err:
                out.append(f"methods: {method_id(m)} with d0 = {d0}, L0 = {L0}, n = {n} -> d1 = {d1}, L1 = {L1}: {err}"
                           + _suggest_width(shape, n, chain, d1, L1, head_dim))
    return out


def _budget_problems(config: dict, sweep: dict) -> list[str]:
    out = []
    t, context = config["train"], config["model"]["context"]
    small = t["small"]
    if small["tokens"] < small["batch_size"] * context:
        out.append(f"train.small.tokens = {small['tokens']}: smaller than one batch of the members "
                   f"({small['batch_size']} x {context} = {small['batch_size'] * context} tokens)")
    trunk = trunk_tokens(config)
    if trunk:
        one = small["batch_size"] * context
        for what, tokens in (("the trunk", trunk), ("each member's branch", small["tokens"] - trunk)):
            if tokens < one:
                out.append(f"members.trunk = {config['members']['trunk']}: {what} would train {tokens} tokens, less "
                           f"than one batch of the members ({one} tokens); choose a share that leaves both at least "
                           f"one batch")
    batch = (t.get("refine") or {}).get("batch_size", t["large"]["batch_size"])
    for budget in sweep["budgets"]:
        for what, b in (("M_0", t["large"]["batch_size"]), ("the refinement", batch)):
            if budget < b * context:
                key = "budgets" if config.get("budgets") else "train.large.tokens"
                out.append(f"{key} = {budget}: smaller than one batch of {what} ({b} x {context} = {b * context} "
                           f"tokens)")
    steps = refine_steps(config, sweep["budgets"])
    for name, opts in config["grow"]["options"].items():
        for key in OPERATORS[name].ramps if name in OPERATORS else ():
            if (opts or {}).get(key, 0) > steps:
                why = ("it would outlast the refinement" if OPERATORS[name].axis == "refine" else
                       "the grown model could not become a plain GPT-2 by its end")
                out.append(f"grow.options.{name}.{key} = {opts[key]}: longer than the shortest refinement ({steps} "
                           f"steps), so {why}; use <= {steps}")
    return out


def _schedule_problems(config: dict, sweep: dict) -> list[str]:
    """Each schedule of the sweep checks the sweep with its description's `check` (growlm.methods)."""
    out = []
    r = config["model"].get("heads_per_kv") or (family_spec(config["model"]["family"])
                                               .settings.get("heads_per_kv", 1))
    for name in dict.fromkeys(method_id(m) for m in sweep["methods"]):
        if name in schedules() and OPERATORS[name].check is not None:
            out += OPERATORS[name].check(config, sweep, heads_per_kv=r)
    return out


def _lr_schedule_problems(config: dict, sweep: dict) -> list[str]:
    """Every training job's learning-rate schedule must fit its steps (`TrainConfig.schedule_problem`: a
    wsd decay that would begin inside the warm-up), each stage named with the budget and method where it
    depends on them; and growth before the decay (members.source) needs members that have one."""
    out, seed = [], sweep["seeds"][0]
    jobs = [("train.small (the members)", member_train(config, seed=seed, member=1))]
    if trunk_tokens(config):
        jobs.append(("train.small (the members' shared trunk)", member_train(config, seed=seed, member=None)))
    for budget, lr in itertools.product(sweep["budgets"], sweep["lrs"][:1]):
        jobs.append((f"train.large (M_0, budget {budget})",
                     train_config(config, "large", seed=seed, tokens=baseline_tokens(config, budget),
                                  lr=float(lr)).run_settings()))
        for method in dict.fromkeys(method_id(m) for m in sweep["methods"]):
            what = f"train.refine ({method}, budget {budget})"
            jobs.append((what, refine_settings(config, method, seed=seed, tokens=int(budget), lr=float(lr))))
    for what, settings in jobs:
        problem = TrainConfig.from_dict(settings).schedule_problem()
        if problem:
            out.append(f"{what}: {problem}")
    if not out:  # each cooldown branch a complete wsd run of its own (growlm.branches)
        out += branch_problems(config, sweep)
    source = config["members"]["source"]
    if source == "before_decay":
        if config["members"].get("pretrained"):
            out.append("members.source = before_decay: members.pretrained were trained elsewhere and have no model "
                       "from before a decay; use members.source: annealed")
        elif train_config(config, "small", seed=seed).schedule != "wsd":
            out.append("members.source = before_decay: the members train under the cosine, which decays from its "
                       "warm-up on; set train.small.schedule (or train.schedule) to wsd")
    return out


def _corpus_problems(config: dict, resolve_source: Callable[[dict], Path | str | None]) -> list[str]:
    out = []
    sources = config["corpus"]["sources"]
    present = {str(s["level"]) for s in sources}
    arms = arm_levels(config)
    for arm in ("members", "large"):
        for level in arms[arm]:
            if level not in present:
                out.append(f"levels.{arm}: level {level!r} has no source in corpus.sources (levels there: "
                           f"{', '.join(sorted(present))})")
    if arms["evaluate"] not in present:
        out.append(f"levels.evaluate: level {arms['evaluate']!r} has no source in corpus.sources")
    if config["members"]["data"] == "clusters":
        books = [s["name"] for s in sources if str(s["level"]) in arms["members"]]
        k = config["members"]["shards"]
        if len(books) < k:
            out.append(f"members.data = clusters: {k} clusters of whole books (members.shards = {k}) need at least {k} "
                       f"sources at the members' levels ({', '.join(arms['members'])}), which have {len(books)}; "
                       f"lower members.shards or use data: shards")
    if any(sources_kind(s) == "url" for s in sources):
        try:  # corpus.mirror, else $GROWLM_MIRROR: a folder, or nothing
            mirror_folder(config["corpus"]["mirror"])
        except GrowlmError as err:
            out.append(str(err))
    names = [s["name"] for s in sources]
    for name in sorted({n for n in names if names.count(n) > 1}):
        out.append(f"corpus.sources: the name {name!r} is used {names.count(name)} times; names must be unique")
    for i, s in enumerate(sources):
        where = f"corpus.sources[{i}] ({s['name']})"
        if s["name"].startswith("."):
            out.append(f"{where}: a source's name is its folder under corpus/sources/, so it may not start with a dot "
                       f"('.' and '..' name other folders); e.g. {s['name'].strip('.') or 'source'!r}")
        kind = sources_kind(s)
        if s.get("sha256") and kind != "url":
            out.append(f"{where}: sha256 checks a download; it goes with url, not {kind}")
        if kind == "url" and not s.get("sha256"):
            out.append(f"{where}: url {s['url']!r} without sha256: every download is checked against the sha256 you "
                       f"give (`sha256sum` of a copy you trust prints it); set sha256: skip to take it unchecked")
        for key in ("config", "split", "revision"):
            if s.get(key) is not None and kind not in ("hf", "path"):
                out.append(f"{where}: {key} is for a dataset (hf, or a path to a folder in the Hub's layout), "
                           f"not a {kind} source")
        if s.get("revision") is not None and kind != "hf":
            out.append(f"{where}: revision names a Hub commit; it goes with hf")
        if s.get("separator") is not None and s.get("clean") == "gutenberg":
            out.append(f"{where}: separator splits documents, but clean: gutenberg reads each file as one book; "
                       f"use clean: documents")
        path = resolve_source(s)
        if path is None:
            continue  # a download (checked against its sha256 when fetched) or a Hub id (checked when read)
        out += _location_problems(where, kind, s[kind], path)
    return out


def _location_problems(where: str, kind: str, spec: str, path: Path | str) -> list[str]:
    if kind == "bundled":
        path = Path(path)
        if not path.is_file():
            return [f"{where}: bundled {spec!r}: no such file ({path})"]
        return [f"{where}: bundled {spec!r}: the file is empty ({path})"] if path.stat().st_size == 0 else []
    files = local_files(str(path))
    if not files:
        if Path(path).is_file():
            return [f"{where}: {kind} {spec!r}: not a kind of file growlm reads (.txt, .jsonl, .json, .parquet, "
                    f".csv, optionally compressed)"]
        if Path(path).is_dir():
            return [f"{where}: {kind} {spec!r}: the folder holds no data file (.txt, .jsonl, .json, .parquet, .csv)"]
        return [f"{where}: {kind} {spec!r}: no such file" + (" (nothing matches the glob)" if any(
            c in spec for c in "*?[") else "")]
    empty = [str(f) for f in files if f.stat().st_size == 0]
    if empty:
        return [f"{where}: {kind} {spec!r}: " + ("the file is empty" if len(files) == 1 else
                                                 f"empty file(s): {', '.join(empty[:3])}")]
    return []


def experiment_problems(config: dict, sweep: dict, resolve_source: Callable[[dict], Path | None]) -> list[str]:
    """What the schema cannot say (see the module docstring), one line per problem."""
    out = name_problems(config["experiment"])
    out += _head_problems(config, sweep) + _size_problems(sweep) + _corpus_problems(config, resolve_source)
    out += shard_problems(config, resolve_source)
    out += _method_problems(config, sweep)
    out += _budget_problems(config, sweep) + _schedule_problems(config, sweep) + _lr_schedule_problems(config, sweep)
    out += tracker_problems((config.get("train") or {}).get("log_to"))
    share = share_problem(config["resources"]["gpu_share"])  # a share whose jobs would over-commit a GPU
    return out + ([share] if share else [])


def family_problems(config: dict) -> list[str]:
    """model.family names a registered family (growlm.family_specs.FAMILY_SPECS; the schema takes any
    name, so that a family is added by its description and class alone)."""
    model = config.get("model")
    family = model.get("family") if isinstance(model, dict) else None
    if not isinstance(family, str) or family in FAMILY_SPECS:  # not a name at all: the schema says so
        return []
    near = difflib.get_close_matches(str(family), list(FAMILY_SPECS), n=1)
    return [f"model.family = {family!r}: not a model family growlm has; one of {', '.join(FAMILY_SPECS)}"
            + (f" (did you mean {near[0]!r}?)" if near else "")]


def nodes_problem(config: dict, executor: str | None) -> str | None:
    """resources.nodes > 1 needs SLURM (one allocation over the nodes, srun to start an agent on each):
    why a run with another executor cannot take it, or None. `executor`: Snakemake's (None: not known)."""
    nodes = config["resources"]["nodes"]
    if nodes == 1 or executor in (None, "slurm"):
        return None
    return (f"resources.nodes = {nodes}: a training job across several nodes runs through SLURM (--profile "
            f"profiles/slurm: one allocation of {nodes} nodes, a torchrun agent started on each), and this run uses "
            f"Snakemake's {executor} executor; on one machine set resources.nodes: 1 (resources.gpu GPUs per job)")


def _raise(problems: list[str]) -> None:
    if problems:
        many = f"{len(problems)} problems:\n  - " if len(problems) > 1 else ""
        raise GrowlmError(many + "\n  - ".join(problems))


def check_config(config: dict, schema_file: str | Path, resolve_source: Callable[[dict], Path | None],
                 fill_defaults: Callable[[dict], None]) -> dict:
    """Coerce `config` in place, check it (raising one GrowlmError that lists every problem), fill
    the schema's defaults (`fill_defaults`, Snakemake's validate) and return the normalised sweep."""
    schema = yaml.safe_load(Path(schema_file).read_text())
    plugins = (config.get("grow") or {}).get("plugins") if isinstance(config.get("grow"), dict) else None
    if isinstance(plugins, str):
        plugins = config["grow"]["plugins"] = [plugins]
    if isinstance(plugins, list) and all(isinstance(p, str) for p in plugins):
        declare(plugins)  # their operators' names and options, read without running them
    config.update(coerce(dict(config), schema, schema.get("$defs", {})))
    if isinstance(config.get("grow"), dict) and isinstance(config["grow"].get("options"), dict):
        config["grow"]["options"] = coerce_options(config["grow"]["options"])
    _raise(schema_problems(config, schema) + family_problems(config))
    fill_defaults(config)
    sweep = normalise_sweep(config)
    _raise(adopt_pretrained(config, sweep))
    _raise(timing_problems(config, sweep))
    _raise(experiment_problems(config, sweep, resolve_source))
    return sweep


def adopt_pretrained(config: dict, sweep: dict) -> list[str]:
    """With `members.pretrained`: read the members (growlm.pretrained), and make the experiment theirs,
    in place - d0 and L0 are the members', and the model settings (family, head size, key/value heads,
    MLP ratio, tying, attention biases) are the members' too, so that M_0 and M_1 are built like them
    (a Qwen2 or Mistral member is read as llama: the import makes it one). The problems found, one line
    each (none without pretrained members); what is legal but worth knowing (a member stored in
    bfloat16, converted to float32) is printed as a warning, one line per member."""
    items = config["members"].get("pretrained") or []
    if not items:
        return []
    out = []
    if config["members"]["data"] != "seed" or config["members"].get("trunk"):
        out.append("members.data and members.trunk say how growlm trains its members; with members.pretrained no "
                   "member is trained (drop them, or drop members.pretrained)")
    found, read = pretrained.problems(items, n_values=[int(n) for n in sweep["n"]],
                                      context=int(config["model"]["context"]))
    out += found
    if out:
        return out
    s = read[0]["shape"]
    overridden = [f"{key} = {', '.join(map(str, sweep[key]))}" for key, own in (("d0", s.d), ("L0", s.L))
                  if [int(v) for v in sweep[key]] != [own]]
    extra = [f"{', '.join(overridden)} of the config {'is' if len(overridden) == 1 else 'are'} overridden by the "
             f"members' own shape (members.pretrained: width {s.d}, {s.L} layer{'s' if s.L != 1 else ''})"] \
        if overridden else []
    pretrained.warn_before_jobs(read, extra=extra)
    sweep["d0"], sweep["L0"] = [s.d], [s.L]
    m = config["model"]
    m.update(family=s.family, head_dim=s.dh, tie_embeddings=s.tied)
    m.update(s.spec.shape_settings(s))  # the family's own settings (none for gpt2)
    for d1 in sweep["d1"]:
        if d1 % s.dh:
            rotary = " (a head-size change under rotary positions: their frequencies depend on it)" \
                if s.spec.positions == "rotary" else ""
            out.append(f"d1 = {d1}: not a multiple of the pretrained members' head size {s.dh}; growth keeps the "
                       f"head size{rotary}; use a multiple of {s.dh * s.r}")
    return out


# ----------------------------------------------------------------------------------------------
# the plugin operators, before the first job
# ----------------------------------------------------------------------------------------------

def plugin_checks(config: dict, sweep: dict) -> list[dict]:
    """What growlm.jobs.plugins checks: every method of the sweep that uses a plugin operator, at every
    (d0, L0, n, d1, L1) of the sweep, with the experiment's model settings and the method's options."""
    checks = []
    for m in sweep["methods"]:
        if not plugin_files(config, m):
            continue
        for d0, L0, d1, L1, n in itertools.product(sweep["d0"], sweep["L0"], sweep["d1"], sweep["L1"], sweep["n"]):
            checks.append(dict(
                method=method_chain(m), n=int(n), d0=int(d0), L0=int(L0), d1=int(d1), L1=int(L1),
                head_dim=config["model"]["head_dim"], tied=config["model"]["tie_embeddings"],
                model={k: v for k, v in model_settings(config, n_embd=d0, n_layer=L0).items()
                       if k not in ("n_positions", "like")},
                options=grow_settings(config, method_id(m))["options"],
            ))
    return checks


def _check_key(spec: dict) -> str:
    """What a plugin check's verdict depends on: the checks (every method, size and option), the plugin
    files' content and growlm's own code (the operators grow through it)."""
    h = hashlib.sha256(json.dumps(spec, sort_keys=True).encode())
    library = Path(__file__).resolve().parent
    for f in [*map(Path, spec["plugins"]), *sorted(library.rglob("*.py"))]:
        h.update(f"{f.name}\0".encode())
        h.update(f.read_bytes() if f.is_file() else b"missing")
    return h.hexdigest()


def check_plugin_operators(config: dict, sweep: dict, spec_file: str | Path) -> str:
    """Import the plugins of `grow.plugins` for real and grow tiny random members with each operator the
    sweep uses (`plugin_checks`, written to `spec_file`), in a child Python that imports this very
    growlm (`python -m growlm.jobs.plugins`): the child's summary line, or a GrowlmError with its
    one-line message naming the file and the problem. The check says that it runs before it does (a
    plugin may take a while to import or grow), and a check that passed is not run again while the
    plugin files, the checks and growlm's code are the same (`_check_key`, kept beside `spec_file`)."""
    spec = Path(spec_file)
    spec.parent.mkdir(parents=True, exist_ok=True)
    checks = {"plugins": config["grow"]["plugins"], "checks": plugin_checks(config, sweep)}
    spec.write_text(json.dumps(checks, indent=2))
    passed, key = spec.with_name("passed.json"), _check_key(checks)
    try:
        before = json.loads(passed.read_text())
    except (OSError, json.JSONDecodeError):
        before = {}
    if before.get("key") == key:
        return f"{before['summary']} (checked before, on the same files)"
    print(f"growlm: checking the plugin operators of {', '.join(checks['plugins'])} on small random members, "
          f"before any job (once for each content of the files)", file=sys.stderr, flush=True)
    proc = subprocess.run([sys.executable, "-m", "growlm.jobs.plugins", str(spec)], env=package_env(),
                          capture_output=True, text=True)
    if proc.returncode:
        raise GrowlmError((proc.stderr.strip().splitlines() or ["the plugin check failed"])[-1])
    summary = proc.stdout.strip()
    passed.write_text(json.dumps({"key": key, "summary": summary}, indent=1))
    return summary
