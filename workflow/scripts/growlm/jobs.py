"""What one workflow job does, as plain functions of paths and settings.

The entry scripts in `workflow/scripts/` call these with values from the `snakemake` object; a
notebook can call them directly. Each one reads its inputs, calls the library, writes its outputs.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import sys
import time
from pathlib import Path

from growlm.errors import GrowlmError


def choose_device() -> str:
    import torch  # here, not at the top: the corpus and report jobs need no torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def checkpoint_dir_for(model_dir: str | Path) -> Path:
    """Checkpoints live beside `results/models/...` under `results/checkpoints/...`, never inside
    a declared output (Snakemake deletes a failed job's outputs)."""
    model_dir = Path(model_dir)
    parts = list(model_dir.parts)
    if "models" in parts:
        parts[parts.index("models")] = "checkpoints"
        return Path(*parts)
    return model_dir.with_name(model_dir.name + ".ckpt")


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# --- corpus -----------------------------------------------------------------------------------

def fetch_source(source: dict, out_file: str | Path, *, bundled: str | None = None) -> None:
    """Copy a bundled source or download it (sha256-checked) to `out_file`."""
    from growlm import corpus

    out_file = Path(out_file)
    out_file.parent.mkdir(parents=True, exist_ok=True)
    if bundled:
        text = corpus.read_source(bundled)
        out_file.write_text(text, encoding="utf-8")
    else:
        if not source.get("sha256"):
            _log(f"warning: source {source['name']} has no sha256; its download is not checked")
        corpus.download_source(source["url"], out_file, source.get("sha256"), source["name"])
    _log(f"source {source['name']} (level {source['level']}): {out_file.stat().st_size} bytes")


def clean_level(source_files: list[str], names: list[str], level: int, out_dir: str | Path,
                stats_file: str | Path, corpus_cfg: dict) -> None:
    from growlm import corpus

    sources = [(name, Path(f).read_text(encoding="utf-8")) for name, f in zip(names, source_files)]
    stats = corpus.prepare_level(
        sources, Path(out_dir), val_fraction=corpus_cfg["val_fraction"],
        test_fraction=corpus_cfg["test_fraction"], min_words=corpus_cfg["min_words"],
        max_words=corpus_cfg["max_words"])
    stats = {"level": level, **stats}
    Path(stats_file).write_text(json.dumps(stats, indent=2, default=float))
    _log(f"level {level}: {json.dumps(stats, default=float)}")


# --- training ---------------------------------------------------------------------------------

def _plan_for(model, cfg, ckpt: Path, memory_limit_gb: float | None):
    """The memory plan of this job: the one a previous attempt left (it may have been stepped down
    after an out-of-memory error), else a new one; written beside the checkpoints."""
    from growlm.plan import make_plan, read_plan, write_plan

    path = ckpt / "plan.json"
    if path.is_file():
        plan = read_plan(path)
        _log(f"memory plan from the previous attempt: {plan.describe()}")
        return plan, path
    plan = make_plan(getattr(model, "config"), context=cfg.context, global_batch=cfg.batch_size, n_devices=1,
                     memory_limit_gb=memory_limit_gb, device=cfg.device, log=_log)
    ckpt.mkdir(parents=True, exist_ok=True)
    write_plan(plan, path)
    return plan, path


def _train_and_save(model, cfg, *, train_file, val_file, out_dir, tokenizer_dir, info: dict,
                    shard: tuple[int, int] | None = None, memory_limit_gb: float | None = None) -> dict:
    import copy

    from growlm.data import load_tokens, shard as take_shard
    from growlm.model import save_model
    from growlm.plan import train_with_replanning

    train_tokens = load_tokens(train_file)
    if shard is not None:
        train_tokens = take_shard(train_tokens, *shard)
    val_tokens = load_tokens(val_file)
    out_dir = Path(out_dir)
    ckpt = checkpoint_dir_for(out_dir)
    _log(f"training {info.get('role')} ({sum(p.numel() for p in model.parameters())} parameters) for "
         f"{cfg.steps} steps of {cfg.batch_size}x{cfg.context} tokens on {cfg.device}; checkpoints in {ckpt}")
    ledger_tmp = ckpt / "ledger.csv"
    plan, plan_path = _plan_for(model, cfg, ckpt, memory_limit_gb)
    initial = copy.deepcopy(model.state_dict())  # a re-planned attempt starts from these weights

    def fresh_model():
        model.load_state_dict(initial)
        return model

    summary = train_with_replanning(fresh_model, train_tokens, val_tokens, cfg, plan, ckpt_dir=ckpt,
                                    ledger_path=ledger_tmp, plan_path=plan_path, log=_log)
    if hasattr(model, "to_gpt2"):
        model = model.to_gpt2()
    save_model(model, out_dir, tokenizer_dir=tokenizer_dir, extra={**info, "train": summary})
    shutil.copy(ledger_tmp, out_dir / "ledger.csv")
    shutil.copy(plan_path, out_dir / "plan.json")
    _log(f"saved {out_dir}; final val loss {summary['final_val_loss']}")
    return summary


def processes_for(config: dict) -> int:
    """Processes to launch: the GPUs a training job asks for (resources.gpu) when that many are
    visible; GROWLM_NPROC overrides (e.g. 2 gloo processes on a CPU, for tests)."""
    import os

    if os.environ.get("GROWLM_NPROC"):
        return int(os.environ["GROWLM_NPROC"])
    import torch

    want = int(config["resources"].get("gpu", 0) or 0)
    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if want > 1 and have < want:
        _log(f"resources.gpu={want} but {have} GPU(s) visible: training in one process")
    return want if want > 1 and have >= want else 1


def _train_distributed(nproc: int, *, model_spec: dict, cfg, train_file, val_file, out_dir, tokenizer_dir,
                       info: dict, memory_limit_gb: float | None) -> dict:
    """Launch `growlm.distributed` under torchrun with the planner's strategy; rank 0 saves."""
    import dataclasses
    import subprocess

    from growlm.distributed import launch_command
    from growlm.model import gpt2_config
    from growlm.plan import make_plan, write_plan

    out_dir = Path(out_dir)
    ckpt = checkpoint_dir_for(out_dir)
    ckpt.mkdir(parents=True, exist_ok=True)
    plan_path = ckpt / "plan.json"
    if not plan_path.is_file():
        spec = {k: v for k, v in model_spec.items() if k != "seed"}
        device = choose_device()
        write_plan(make_plan(gpt2_config(**spec), context=cfg.context, global_batch=cfg.batch_size, n_devices=nproc,
                             memory_limit_gb=memory_limit_gb, device=device, log=_log), plan_path)
    (ckpt / "model.json").write_text(json.dumps(model_spec))
    train_fields = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in ("device", "extra")}
    (ckpt / "train.json").write_text(json.dumps(train_fields))
    args = ["--model-config", str(ckpt / "model.json"), "--train-file", str(train_file), "--val-file", str(val_file),
            "--train-config", str(ckpt / "train.json"), "--plan", str(plan_path), "--ckpt-dir", str(ckpt),
            "--ledger", str(ckpt / "ledger.csv"), "--out-dir", str(out_dir), "--summary", str(ckpt / "summary.json")]
    if tokenizer_dir:
        args += ["--tokenizer-dir", str(tokenizer_dir)]
    cmd = launch_command(nproc, args)
    _log(f"launching {nproc} processes: {' '.join(cmd)}")
    proc = subprocess.run(cmd)
    if proc.returncode != 0:
        raise GrowlmError(f"torchrun with {nproc} processes failed (exit {proc.returncode}); the job resumes from "
                          f"{ckpt} when rerun")
    summary = json.loads((ckpt / "summary.json").read_text())
    meta_path = out_dir / "growlm.json"
    meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
    meta_path.write_text(json.dumps({**meta, **info, "train": summary}, indent=2, default=str))
    shutil.copy(plan_path, out_dir / "plan.json")
    return summary


def train_from_scratch(*, config: dict, stage: str, n_embd: int, n_layer: int, seed: int, init_seed: int,
                       train_file, val_file, tokenizer_dir, out_dir, shard=None, role: str,
                       tokens: int | None = None, lr: float | None = None) -> dict:
    """A small member (stage 'small') or the baseline M_0 (stage 'large')."""
    from growlm.experiment import model_kwargs, train_config
    from growlm.model import build_model
    from growlm.tokenizer import load_tokenizer

    vocab = len(load_tokenizer(tokenizer_dir))
    kwargs = model_kwargs(config, n_embd=n_embd, n_layer=n_layer, vocab_size=vocab)
    cfg = train_config(config, stage, seed=seed, device=choose_device(), tokens=tokens, lr=lr)
    if stage == "small":  # kept for optimizer-state carry-over (grow.optimizer_state: carry)
        cfg.save_moments = str(Path(out_dir) / MOMENTS_FILE)
    nproc = processes_for(config)
    if nproc > 1 and shard is None:
        return _train_distributed(nproc, model_spec={**kwargs, "seed": init_seed}, cfg=cfg, train_file=train_file,
                                  val_file=val_file, out_dir=out_dir, tokenizer_dir=tokenizer_dir,
                                  info={"role": role, "init_seed": init_seed, "data_seed": seed, "processes": nproc},
                                  memory_limit_gb=config["resources"].get("memory_limit_gb"))
    model = build_model(seed=init_seed, **kwargs)
    return _train_and_save(model, cfg, train_file=train_file, val_file=val_file, out_dir=out_dir,
                           tokenizer_dir=tokenizer_dir, shard=shard,
                           memory_limit_gb=config["resources"].get("memory_limit_gb"),
                           info={"role": role, "init_seed": init_seed, "data_seed": seed,
                                 "shard": list(shard) if shard else None})


RAMPED = {"concat": ("ramp_steps", "ln_ramp_steps"), "msg": ("ramp_steps",)}
LEARNED = ("ligo", "mango")


def growth_options(chain: list[str], options: dict, *, refine_steps: int, data_file=None, batch_size: int = 16,
                   context: int = 128, seed: int = 0) -> dict:
    """The options a grow job passes: the config's, plus mask ramps that end within the shortest
    refinement (a fifth of it unless configured) and, for learned operators, level-1 batches."""
    from growlm.growth import options_of

    opts = dict(options)
    for name in chain:
        for key in RAMPED.get(name, ()):
            if key in options_of(name) and key not in opts:
                opts[key] = max(1, refine_steps // 5)
        if name in LEARNED and "batches" not in opts and opts.get("steps", 1):
            from growlm.data import BatchSampler, load_tokens

            sampler = BatchSampler(load_tokens(data_file), batch_size=batch_size, context=context, seed=seed + 7919)
            opts["batches"] = [sampler.batch(i)[0] for i in range(int(opts.get("steps", 100)))]
    for key in ("ramp_steps", "ln_ramp_steps"):
        if opts.get(key, 0) > refine_steps:
            raise GrowlmError(f"grow.options {key}={opts[key]} is longer than the refinement ({refine_steps} steps): "
                              "the grown model could not become a plain GPT-2 by the end of training")
    return opts


MOMENTS_FILE = "optimizer.safetensors"  # a member's final AdamW moments (written by every small job)
GROWN_MOMENTS_FILE = "moments.safetensors"  # the grown model's carried-over moments


def grow(*, member_dirs: list[str], method: str, n_embd: int, n_layer: int, seed: int, options: dict,
         out_dir, optimizer_state: str = "fresh") -> None:
    """Combine the trained members into M'_1 with a growth operator; record its cost. With
    `optimizer_state="carry"` the members' AdamW moments are grown too (growlm.growth.moments)."""
    from growlm.experiment import method_chain
    from growlm.growth import grow as grow_models, save_grown
    from growlm.model import load_model
    from growlm.phases import phase

    members = [load_model(d) for d in member_dirs]
    chain = method_chain(method)
    t0 = time.perf_counter()
    with phase("grow"):
        grown = grow_models(members, chain if len(chain) > 1 else chain[0], n_embd=n_embd, n_layer=n_layer,
                            seed=seed, **options)
    wall = time.perf_counter() - t0
    flops = int(getattr(grown, "growlm_growth_flops", 0))
    save_grown(grown, out_dir)
    from growlm.growth import members_used

    used = member_dirs[:members_used(chain, len(member_dirs))]  # a single-source chain grows m_1 only
    member_cost = []
    for d in dict.fromkeys(str(d) for d in used):  # m_1 fed n times (control) costs once
        meta = json.loads((Path(d) / "growlm.json").read_text())
        member_cost.append({"dir": str(d), "flops": meta["train"]["flops"], "wall_s": meta["train"]["wall_s"]})
    carried = {}
    if optimizer_state == "carry":
        from growlm.growth.moments import grow_moments, load_moments, save_grown_moments

        loaded = [load_moments(Path(d) / MOMENTS_FILE) for d in member_dirs]
        moments = grow_moments(members, [m for m, _ in loaded], chain, n_embd=n_embd, n_layer=n_layer,
                               seed=seed, **options)
        step = max(s for _, s in loaded)
        save_grown_moments(Path(out_dir) / GROWN_MOMENTS_FILE, moments, step)
        carried = {"moments": GROWN_MOMENTS_FILE, "moments_step": step}
        _log(f"carried the members' AdamW moments over (step {step:.0f}) for {len(moments)} parameters")
    shown = {k: v for k, v in options.items() if k != "batches"}
    (Path(out_dir) / "growth.json").write_text(json.dumps(
        {"method": method, "chain": chain, "options": shown, "growth_flops": flops, "growth_wall_s": wall,
         "members": member_cost, "optimizer_state": optimizer_state, **carried}, indent=2))
    _log(f"grew {len(members)} member(s) with {method} into width {n_embd}, depth {n_layer} in {wall:.2f}s")


def vcycle(*, config: dict, n_embd: int, n_layer: int, seed: int, train_file, val_file, vocab_size: int,
           out_dir) -> None:
    """The Multi-Level V-cycle as one more arm (it reuses no small model): M_0's own initialisation
    is coalesced to a model `factor` times narrower and shallower, trained on level 1 for
    `vcycle.tokens` tokens (its FLOPs are the growth cost), de-coalesced and interpolated with the
    initialisation (theta = (1 - alpha) theta_init + alpha theta_decoalesced); refine trains on."""
    from growlm.experiment import model_kwargs, train_config
    from growlm.growth import save_grown
    from growlm.growth.multilevel import coalesce, decoalesce, interpolate
    from growlm.model import build_model

    vc = config["vcycle"]
    k = int(vc["factor"])
    if n_embd % k or n_layer % k or (n_embd // k) % config["model"]["head_dim"]:
        raise GrowlmError(f"vcycle factor {k} does not divide width {n_embd} and depth {n_layer} into whole heads")
    init = build_model(seed=seed, **model_kwargs(config, n_embd=n_embd, n_layer=n_layer, vocab_size=vocab_size))
    small = coalesce(init, n_embd=n_embd // k, n_layer=max(1, n_layer // k))
    cfg = train_config(config, "large", seed=seed + 104729, device=choose_device(), tokens=int(vc["tokens"]))
    cfg.lr = float(vc["lr"])
    out_dir = Path(out_dir)
    summary = _train_and_save(small, cfg, train_file=train_file, val_file=val_file, out_dir=out_dir / "coalesced",
                              tokenizer_dir=None, info={"role": "vcycle coalesced model"})
    grown = interpolate(init, decoalesce(small.cpu(), n_embd=n_embd, n_layer=n_layer), alpha=float(vc["alpha"]))
    save_grown(grown, out_dir)
    (out_dir / "growth.json").write_text(json.dumps(
        {"method": "vcycle", "chain": ["vcycle"], "options": vc, "growth_flops": summary["flops"],
         "growth_wall_s": summary["wall_s"], "members": []}, indent=2))
    _log(f"V-cycle: coalesced x{k}, trained {summary['tokens']} tokens, interpolated with alpha {vc['alpha']}")


def apollo(*, config: dict, n_embd: int, n_layer: int, seed: int, train_file, vocab_size: int, out_dir) -> None:
    """The Apollo-style progressive control (growlm.apollo; it reuses no small model): M_0's own
    initialisation trained with shared layers, sampled depth and growing stages for `apollo.tokens`
    tokens (the growth cost); refine trains on."""
    from growlm.apollo import apollo_schedule
    from growlm.data import load_tokens
    from growlm.experiment import model_kwargs
    from growlm.growth import save_grown
    from growlm.model import build_model

    ap, t = config["apollo"], config["train"]
    init = build_model(seed=seed, **model_kwargs(config, n_embd=n_embd, n_layer=n_layer, vocab_size=vocab_size))
    model, summary = apollo_schedule(init, load_tokens(train_file), tokens=int(ap["tokens"]), lr=float(ap["lr"]),
                                     batch_size=int(t["large"]["batch_size"]), context=int(config["model"]["context"]),
                                     seed=seed + 15485863, warmup_steps=int(ap["warmup_steps"]),
                                     weight_decay=float(t["weight_decay"]), grad_clip=float(t["grad_clip"]), log=_log)
    out_dir = Path(out_dir)
    save_grown(model, out_dir)
    (out_dir / "growth.json").write_text(json.dumps(
        {"method": "apollo", "chain": ["apollo"], "options": ap, "growth_flops": summary["flops"],
         "growth_wall_s": summary["wall_s"], "members": [], "stages": summary["stages"]}, indent=2))
    _log(f"Apollo schedule: {summary['steps']} steps in {len(summary['stages'])} stages, {summary['flops']:.3e} FLOPs")


def refine(*, config: dict, grown_dir, seed: int, train_file, val_file, tokenizer_dir, out_dir,
           tokens: int | None = None, lr: float | None = None) -> dict:
    """Train M'_1 into M_1 with the baseline's loop and budget (fresh AdamW, short re-warm-up)."""
    from growlm.experiment import train_config
    from growlm.growth import load_grown

    model = load_grown(grown_dir)
    growth = json.loads((Path(grown_dir) / "growth.json").read_text())
    cfg = train_config(config, "refine", seed=seed, device=choose_device(), tokens=tokens, lr=lr)
    if growth.get("optimizer_state") == "carry":
        cfg.init_moments = str(Path(grown_dir) / growth["moments"])
    return _train_and_save(model, cfg, train_file=train_file, val_file=val_file, out_dir=out_dir,
                           tokenizer_dir=tokenizer_dir, info={"role": "refined", "growth": growth,
                                                              "data_seed": seed},
                           memory_limit_gb=config["resources"].get("memory_limit_gb"))


def evaluate_model(*, model_dir, test_files: dict[int, str], context: int, max_tokens: int, out_file) -> dict:
    """Held-out loss, perplexity and next-token accuracy on each level's test split."""
    from growlm.model import load_model

    return _evaluate(load_model(model_dir), str(model_dir), test_files, context, max_tokens, out_file)


def evaluate_ensemble(*, member_dirs: list[str], test_files: dict[int, str], context: int, max_tokens: int,
                      out_file) -> dict:
    """The same metrics for the untrained logit-average ensemble of the members."""
    from growlm.model import LogitEnsemble, load_model

    ensemble = LogitEnsemble([load_model(d) for d in member_dirs])
    return _evaluate(ensemble, f"ensemble of {len(member_dirs)}", test_files, context, max_tokens, out_file)


def _evaluate(model, name: str, test_files, context, max_tokens, out_file) -> dict:
    from growlm.data import load_tokens
    from growlm.train import evaluate

    device = choose_device()
    model = model.to(device)
    result = {"model": name, "levels": {}}
    for level, f in sorted(test_files.items()):
        result["levels"][str(level)] = evaluate(model, load_tokens(f), context=context, batch_size=16,
                                                max_tokens=max_tokens, device=device)
    Path(out_file).parent.mkdir(parents=True, exist_ok=True)
    Path(out_file).write_text(json.dumps(result, indent=2))
    _log(f"evaluated {name}: {json.dumps(result['levels'])}")
    return result


@contextlib.contextmanager
def job_log(log_file: str | Path, stage: str):
    """Send stdout and stderr to the job's log; a GrowlmError becomes one line (in the log and on
    the terminal) and exit status 1, with no traceback."""
    Path(log_file).parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "a", buffering=1) as fh:
        try:
            with contextlib.redirect_stdout(fh), contextlib.redirect_stderr(fh):
                yield
        except GrowlmError as err:
            msg = f"growlm {stage}: error: {err}"
            print(msg, file=fh, flush=True)
            print(msg, file=sys.__stderr__, flush=True)
            sys.exit(1)
