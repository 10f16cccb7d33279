"""The experiment against its corpus, before any job: whether each member's shard holds enough text, how
often a member would read its text, and what the sweep would cost (the warnings `experiment_warnings`
prints at the dry run); and the members' budget where the config gives it as a rule rather than a number
(`timing_problems`: G_stack's formula, or a share of M_0's FLOPs). Torch-free (the Snakefile's checks
import it).
"""


from __future__ import annotations

import itertools
import shutil
from pathlib import Path
from typing import Callable

import numpy as np

from growlm.experiment import arm_levels, level_dir, model_settings, trunk_tokens
from growlm.flops import matmul_params, shape_flops, train_flops_per_token
from growlm.methods import members_used, method_id, needs_single_member_control
from growlm.outputs import results_dir
from growlm.recipes import gstack_problem, gstack_tokens
from growlm.shape import ModelShape
from growlm.sources import local_files


# against the corpus: shards, and what a run would cost
# ----------------------------------------------------------------------------------------------

BYTES_PER_TOKEN = 4.0  # prose under a byte-level BPE of a few thousand tokens (the bundled books: 3.6 to 4.3)
TRAIN_SHARE_DEFAULT = 0.9
MAX_EPOCHS_QUIET = 20  # a member that reads its text more often than this is worth a warning


def _member_tokens(config: dict, resolve_source: Callable[[dict], Path | str | None]) -> tuple[int | None, bool]:
    """(tokens of the members' training split, exact?): counted in the token file when an earlier run
    built it, else estimated from the local sources' sizes (None when a source is a download or a Hub
    dataset, whose size is not known before it is read)."""
    levels = arm_levels(config)["members"]
    built = Path(results_dir(config["experiment"])) / "tokens" / level_dir(levels) / "train.npy"
    if built.is_file():
        try:
            return int(np.load(built, mmap_mode="r").shape[0]), True
        except (OSError, ValueError):
            pass
    total = 0
    for s in config["corpus"]["sources"]:
        if str(s["level"]) not in levels:
            continue
        path = resolve_source(s)
        if path is None:
            return None, False
        files = [Path(path)] if Path(path).is_file() else local_files(str(path))
        total += sum(f.stat().st_size for f in files if f.is_file())
    c = config["corpus"]
    share = 1 - c["val_fraction"] - c["test_fraction"]
    return int(total * share / BYTES_PER_TOKEN), False


def shard_problems(config: dict, resolve_source: Callable[[dict], Path | str | None]) -> list[str]:
    members = config["members"]
    if members["data"] != "shards":
        return []
    tokens, exact = _member_tokens(config, resolve_source)
    if tokens is None:
        return []
    k, window = members["shards"], config["model"]["context"] + 1
    # an estimate may be 4x off, so only what cannot work even at one byte a token is an error
    bound = tokens if exact else int(tokens * BYTES_PER_TOKEN)
    if bound // k < window:
        most = max(1, bound // window)
        return [f"members.shards = {k}: each member would read {'' if exact else 'at most '}{bound // k} tokens of the "
                f"members' text ({'counted' if exact else 'estimated'}: {bound} tokens in all), fewer than one training "
                f"window of {window} (model.context + 1); use at most {most} shards"]
    return []


def experiment_warnings(config: dict, sweep: dict, resolve_source: Callable[[dict], Path | str | None],
                        results: str) -> list[str]:
    """Legal but surprising values, one line each (printed in the terminal before any job): downloads
    taken unchecked, members that would read their shard many times over, and an experiment too large
    for the machine it is about to run on."""
    out = []
    for i, s in enumerate(config["corpus"]["sources"]):
        if s.get("url") and s.get("sha256") == "skip":
            out.append(f"corpus.sources[{i}] ({s['name']}): sha256: skip - {s['url']} is taken without a check")
    members = config["members"]
    if members["data"] == "shards":
        tokens, exact = _member_tokens(config, resolve_source)
        budget = int(config["train"]["small"]["tokens"]) - trunk_tokens(config)
        if tokens:
            per = max(1, tokens // members["shards"])
            if budget / per > MAX_EPOCHS_QUIET:
                out.append(f"members.shards = {members['shards']}: each member's shard holds {'' if exact else 'about '}"
                           f"{per} tokens ({'counted' if exact else 'estimated from the sources'}), so its budget of "
                           f"{budget} tokens reads it about {budget / per:.0f} times; fewer shards give each more text")
    out += _unread_members(config, sweep)
    out += _cost_warnings(config, sweep)
    return out


def _unread_members(config: dict, sweep: dict) -> list[str]:
    """An n larger than any method of the sweep reads: all n members are trained and evaluated all the same
    (they are the experiment's members, and the members' ensemble is a control of all n), while a single-source
    method (msg, hyperclone, ...) grows from m_1 alone and a schedule from none. One line per such n, with what
    it costs, so that `n: [1000]` for msg is not 1,000 trainings by surprise."""
    if config["members"].get("pretrained"):  # brought, not trained
        return []
    methods = [method_id(m) for m in sweep["methods"]]
    out = []
    for n in sorted({int(v) for v in sweep["n"]}):
        used = max(members_used(m, n) for m in methods)
        if used >= n:
            continue
        trainings = n * len(sweep["seeds"]) * len(sweep["d0"]) * len(sweep["L0"])
        why = ("serve only the members' ensemble (controls.ensemble)" if config["controls"]["ensemble"]
               else "serve nothing (controls.ensemble is off)")
        reads = ", ".join(f"{m} reads {'m_1 alone' if members_used(m, n) else 'none'}" for m in methods)
        out.append(f"n = {n}: no method of the sweep reads more than {used} member{'s' if used != 1 else ''} "
                   f"({reads}), yet all {n:,} are trained and evaluated ({trainings:,} trainings); the other "
                   f"{n - used:,} {why}. n: [{max(used, 1)}] trains what the methods read")
    return out


def _gpu_here() -> bool:
    """An NVIDIA GPU on this machine (torch-free: the driver's files or nvidia-smi)."""
    return Path("/proc/driver/nvidia/gpus").is_dir() and any(Path("/proc/driver/nvidia/gpus").iterdir()) or bool(
        shutil.which("nvidia-smi") and Path("/dev/nvidia0").exists())


CPU_FLOPS = 1e11  # float32 training on a fast many-core CPU, per second (2 cores: about 6e10)
WARN_CPU_HOURS = 4.0


def sweep_training_flops(config: dict, sweep: dict) -> tuple[float, int]:
    """(training FLOPs of every model of the sweep, the largest model's matrix-multiply weights):
    members, M_0 and one refinement per method, at every budget, rate and seed (growth and evaluation
    left out)."""
    vocab, context = config["tokenizer"]["vocab_size"], config["model"]["context"]
    runs = len(sweep["seeds"]) * len(sweep["lrs"])
    total, largest = 0.0, 0
    for d0, L0, n in itertools.product(sweep["d0"], sweep["L0"], sweep["n"]):
        per = train_flops_per_token(n_embd=d0, n_layer=L0, vocab_size=vocab, context=context)
        total += per * int(config["train"]["small"]["tokens"]) * n * len(sweep["seeds"])
    for d1, L1 in itertools.product(sweep["d1"], sweep["L1"]):
        per = train_flops_per_token(n_embd=d1, n_layer=L1, vocab_size=vocab, context=context)
        largest = max(largest, matmul_params(n_embd=d1, n_layer=L1, vocab_size=vocab))
        grown = [method_id(m) for m in sweep["methods"]]
        if config["controls"]["single_member"]:
            grown += [m for m in grown if needs_single_member_control(m)]
        arms = 1 + len(grown) * len(sweep["d0"]) * len(sweep["L0"]) * len(sweep["n"])
        total += per * sum(sweep["budgets"]) * runs * arms
    return total, largest


def _cost_warnings(config: dict, sweep: dict) -> list[str]:
    if _gpu_here():
        return []
    out = []
    if config["resources"].get("gpu"):
        out.append(f"resources.gpu = {config['resources']['gpu']}, but this machine has no NVIDIA GPU: every job "
                   f"trains on the CPU")
    flops, largest = sweep_training_flops(config, sweep)
    hours = flops / CPU_FLOPS / 3600

    def duration(h: float) -> str:
        return f"{h / 24:.0f} days" if h > 48 else f"{h:.0f} hours"

    if hours > WARN_CPU_HOURS:
        hub = [f"{s.get('max_rows') or 'all'} rows of {s['hf']}" for s in config["corpus"]["sources"]
               if s.get("hf") and not Path(s["hf"]).is_dir()]
        out.append(f"this experiment trains about {flops:.1e} FLOPs (its large models have {largest / 1e6:.0f}M "
                   f"matrix weights) and this machine has no GPU: about {duration(hours)} at {CPU_FLOPS:.0e} FLOP/s, "
                   f"a fast CPU's float32 rate ({duration(hours * CPU_FLOPS / 6e10)} on 2 cores)"
                   + (f"; it also reads {', '.join(hub)} from the Hugging Face Hub" if hub else "")
                   + ". Stop it with Ctrl-C if that is not what you meant")
    return out


# the members' budget as a rule
# ----------------------------------------------------------------------------------------------

def timing_problems(config: dict, sweep: dict) -> list[str]:
    """`train.small.tokens: gstack` (the members' tokens by G_stack's growth-timing formula,
    growlm.recipes) resolved in place into a number, or why it cannot be."""
    small = config["train"]["small"]
    share = config["members"].get("flops_share")
    if share is not None:
        return flops_share_problems(config, sweep, float(share))
    if small.get("tokens") != "gstack":
        return []
    if len(sweep["d1"]) * len(sweep["L1"]) * len(sweep["budgets"]) != 1:
        return [f"train.small.tokens = gstack: the formula gives the members' tokens for one target and budget; this "
                f"sweep has d1 = {sweep['d1']}, L1 = {sweep['L1']}, budgets = {sweep['budgets']}"]
    settings = model_settings(config, n_embd=sweep["d1"][0], n_layer=sweep["L1"][0])
    settings.pop("like", None)
    shape = ModelShape.of({**settings, "vocab_size": config["tokenizer"]["vocab_size"]})
    budget = int(sweep["budgets"][0])
    problem = gstack_problem(shape.n_params, budget)
    if problem:
        return [problem]
    small["tokens"] = gstack_tokens(shape.n_params, budget)
    return []


def flops_share_problems(config: dict, sweep: dict, share: float) -> list[str]:
    """`members.flops_share`: the members' token budget resolved in place from their share of M_0's FLOPs
    (`growlm.flops`: each member's training FLOPs = share x M_0's at the sweep's budget), or why it
    cannot be."""
    small = config["train"]["small"]
    if small.get("tokens") == "gstack" or config["members"].get("pretrained"):
        return ["members.flops_share sets the members' training budget: drop train.small.tokens = gstack or "
                "members.pretrained (whose training is not growlm's), or members.flops_share"]
    keys = ("d0", "L0", "d1", "L1", "budgets")
    if any(len(sweep[k]) != 1 for k in keys):
        return ["members.flops_share: the members' budget is a share of one M_0's FLOPs; this sweep has "
                + ", ".join(f"{k} = {sweep[k]}" for k in keys)]

    def per_token(width, depth) -> int:
        settings = model_settings(config, n_embd=width, n_layer=depth)
        settings.pop("like", None)
        shape = ModelShape.of({**settings, "vocab_size": config["tokenizer"]["vocab_size"]})
        return train_flops_per_token(context=config["model"]["context"], **shape_flops(shape))

    m0_flops = int(sweep["budgets"][0]) * per_token(sweep["d1"][0], sweep["L1"][0])
    tokens = int(round(share * m0_flops / per_token(sweep["d0"][0], sweep["L0"][0])))
    window = int(small["batch_size"]) * int(config["model"]["context"])
    if tokens < window:
        return [f"members.flops_share = {share:g} gives each member {tokens} tokens, less than one batch ({window})"]
    small["tokens"] = tokens
    return []
