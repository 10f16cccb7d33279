"""Resumable checkpoints: tensors in safetensors, everything else in JSON, a manifest of sha256 sums.

A checkpoint is a folder `step_<k>/` inside a job's checkpoint directory, which is *not* a declared
Snakemake output (Snakemake deletes a failed job's outputs). It is written to a temporary folder
and renamed, so a killed job leaves either a whole checkpoint or none; the manifest also catches a
truncated or corrupted file, in which case `load_latest` falls back to the previous checkpoint and
says so. Nothing is unpickled.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                     get_optimizer_state_dict, set_model_state_dict,
                                                     set_optimizer_state_dict)
from torch.distributed.fsdp import FSDPModule

from growlm import hints
from growlm.atomic import atomic_folder, remove_temporaries
from growlm.errors import GrowlmError, sha256

MANIFEST = "manifest.json"
# under wsd, the checkpoint where the decay begins (growlm.train), kept beside the step_* ones and never pruned
# with them: a member is grown from it before its decay (growlm.runner.save_before_decay)
DECAY_START = "decay_start"
# the states a wsd run keeps where its cooldown branches leave it (growlm.train's keep_at; growlm.envelope):
# BRANCH_PREFIX + the point's id, beside the step_* ones and never pruned with them
BRANCH_PREFIX = "branch_"


def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def is_fsdp(model: torch.nn.Module) -> bool:
    """Whether `model` is sharded by FSDP2 (`fully_shard`)."""
    return isinstance(model, FSDPModule)


def _full_options():
    return StateDictOptions(full_state_dict=True, cpu_offload=True)


def _param_fqns(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """The first name of each optimizer parameter, in `optimizer.state_dict()` index order."""
    names = {}
    for name, p in model.named_parameters():
        names.setdefault(id(p), name)
    return [names[id(p)] for g in optimizer.param_groups for p in g["params"]]


def _optimizer_state_dict(optimizer: torch.optim.Optimizer, model: torch.nn.Module | None) -> dict:
    """`optimizer.state_dict()`; under FSDP2 the full (gathered) one, a collective, with FQN keys
    turned back into the indices a plain optimizer uses, so that checkpoints load under any strategy."""
    if model is None or not is_fsdp(model):
        return optimizer.state_dict()
    sd = get_optimizer_state_dict(model, optimizer, options=_full_options())
    if "param_groups" not in sd:  # full state dicts offloaded to the CPU go to rank 0 only
        return {"state": {}, "param_groups": []}
    index = {fqn: i for i, fqn in enumerate(_param_fqns(model, optimizer))}
    groups = [{**g, "params": [index[f] for f in g["params"]]} for g in sd["param_groups"]]
    return {"state": {index[f]: v for f, v in sd["state"].items()}, "param_groups": groups}


def _optimizer_to_flat(optimizer: torch.optim.Optimizer,
                       model: torch.nn.Module | None = None) -> tuple[dict[str, torch.Tensor], dict]:
    sd = _optimizer_state_dict(optimizer, model)
    tensors, scalars = {}, {}
    for idx, state in sd["state"].items():
        for key, value in state.items():
            if torch.is_tensor(value):
                tensors[f"{idx}.{key}"] = value.detach().contiguous().cpu()
            else:
                scalars[f"{idx}.{key}"] = value
    return tensors, {"param_groups": sd["param_groups"], "scalars": scalars}


def _optimizer_from_flat(optimizer: torch.optim.Optimizer, tensors: dict, meta: dict,
                         model: torch.nn.Module | None = None) -> None:
    state: dict[int, dict] = {}
    for key, value in tensors.items():
        idx, name = key.split(".", 1)
        state.setdefault(int(idx), {})[name] = value
    for key, value in meta["scalars"].items():
        idx, name = key.split(".", 1)
        state.setdefault(int(idx), {})[name] = value
    if model is not None and is_fsdp(model):  # every rank holds the full state; FSDP2 shards it
        fqns = _param_fqns(model, optimizer)
        groups = [{**g, "params": [fqns[i] for i in g["params"]]} for g in meta["param_groups"]]
        set_optimizer_state_dict(model, optimizer, {"state": {fqns[i]: v for i, v in state.items()},
                                                    "param_groups": groups}, options=_full_options())
        return
    optimizer.load_state_dict({"state": state, "param_groups": meta["param_groups"]})


def _model_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    # safetensors refuses shared storage (tied embeddings): keep the first name of each tensor
    # DDP's `module.` prefix is dropped and FSDP2 shards are gathered (a collective), so that a
    # checkpoint loads under any strategy or none
    model = getattr(model, "module", model)
    if is_fsdp(model):
        full = get_model_state_dict(model, options=_full_options())
        first = {}  # tied weights come back as copies: keep the first name of each parameter
        for name, p in model.named_parameters(remove_duplicate=False):
            first.setdefault(id(p), name)
        aliases = {n for n, p in model.named_parameters(remove_duplicate=False) if first[id(p)] != n}
        return {n: t.detach().contiguous().cpu() for n, t in full.items() if n not in aliases}
    out, seen = {}, set()
    for name, t in model.state_dict().items():
        key = t.data_ptr() if t.numel() else name
        if key in seen:
            continue
        seen.add(key)
        out[name] = t.detach().contiguous().cpu()
    return out


def save_checkpoint(ckpt_dir: str | Path, step: int, model: torch.nn.Module,
                    optimizer: torch.optim.Optimizer, state: dict, *, keep: int = 2, name: str | None = None) -> Path:
    """Write `step_<step>/` atomically and keep only the newest `keep` checkpoints; with `name`, a
    checkpoint of that name (`DECAY_START`), which no other is pruned for and none prunes."""
    ckpt_dir = Path(ckpt_dir)
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    final = ckpt_dir / (name or f"step_{step:08d}")
    model_tensors = _model_tensors(model)  # collectives under FSDP2: every rank takes part
    opt_tensors, opt_meta = _optimizer_to_flat(optimizer, model)
    if _rank() != 0:  # only rank 0 writes; the others wait until the checkpoint is whole
        dist.barrier()
        return final
    remove_temporaries(ckpt_dir)  # a checkpoint half-written when the job was killed: it holds the folder
    with atomic_folder(final) as tmp:
        save_file(model_tensors, tmp / "model.safetensors")
        save_file(opt_tensors, tmp / "optimizer.safetensors")
        (tmp / "optimizer.json").write_text(json.dumps(opt_meta))
        (tmp / "state.json").write_text(json.dumps(state))
        files = ["model.safetensors", "optimizer.safetensors", "optimizer.json", "state.json"]
        manifest = {"step": step, "files": {f: sha256(tmp / f) for f in files}}
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1))
    for old in sorted(ckpt_dir.glob("step_*"))[:-keep] if name is None else ():
        shutil.rmtree(old, ignore_errors=True)
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
    return final


def verify(path: Path) -> str | None:
    """None if the checkpoint at `path` is whole, else the reason it is not."""
    mf = path / MANIFEST
    if not mf.is_file():
        return "manifest missing"
    try:
        manifest = json.loads(mf.read_text())
    except json.JSONDecodeError:
        return "manifest unreadable"
    for name, digest in manifest["files"].items():
        f = path / name
        if not f.is_file():
            return f"{name} missing"
        if sha256(f) != digest:
            return f"{name} checksum mismatch"
    return None


def run_identity(model: torch.nn.Module, settings: dict, inputs: dict | None = None) -> dict[str, str]:
    """What a training run's result depends on, part by part, each a sha256: its settings, the model's
    initial weights, and every file it reads (`inputs`, {what: sha256}: the training and validation
    tokens, the tokenizer, ...). A collective under FSDP2."""
    h = hashlib.sha256()
    for name, t in sorted(_model_tensors(model).items()):
        h.update(name.encode())
        h.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    settings_digest = hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()
    return {"settings": settings_digest, "initial weights": h.hexdigest(),
            **{str(k): str(v) for k, v in sorted((inputs or {}).items())}}


def fingerprint(identity: dict[str, str]) -> str:
    """One sha256 of a run's identity (`run_identity`): a checkpoint resumes only a run with the same."""
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()


def checkpoint_dir_for(model_dir: str | Path) -> Path:
    """Checkpoints live beside `results/models/...` under `results/checkpoints/...`, never inside
    a declared output (Snakemake deletes a failed job's outputs)."""
    model_dir = Path(model_dir)
    parts = list(model_dir.parts)
    if "models" in parts:
        parts[parts.index("models")] = "checkpoints"
        return Path(*parts)
    return model_dir.with_name(model_dir.name + ".ckpt")


def remove_finished(ckpt_dir: str | Path) -> None:
    """A finished run's checkpoint folder, once its model is saved: nothing in it is needed again,
    and a checkpoint left behind could only be resumed by mistake."""
    if _rank() != 0:
        return
    ckpt_dir = Path(ckpt_dir)
    shutil.rmtree(ckpt_dir, ignore_errors=True)
    for parent in ckpt_dir.parents:  # the folders that held only it (results/checkpoints/small/...)
        try:
            parent.rmdir()
        except OSError:  # not empty, or not ours
            break


def verify_named(ckpt_dir: str | Path, name: str) -> bool:
    """Whether the named checkpoint `name` (a kept state: `DECAY_START`, a cooldown branch's) is whole."""
    path = Path(ckpt_dir) / name
    return path.is_dir() and verify(path) is None


def load_latest(ckpt_dir: str | Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                log=print, identity: dict[str, str] | None = None, at_most: int | None = None) -> dict | None:
    """Restore the newest whole checkpoint into `model` and `optimizer`; return its state or None.

    With `identity` (`run_identity`), checkpoints of another run (other settings, initial weights or
    data, e.g. a job rerun after its config or its token files changed) are not resumed: they are
    removed, saying which parts differ, and the run starts from the beginning. `at_most`: resume from no
    checkpoint past this step (a state the run must keep there is missing: the run passes it again)."""
    ckpt_dir = Path(ckpt_dir)
    if not ckpt_dir.is_dir():
        return None
    for path in sorted(ckpt_dir.glob("step_*"), reverse=True):
        if at_most is not None and int(path.name.split("_")[1]) > at_most:
            log(f"not resuming from {path.name}: the state kept at step {at_most} is missing, so the run passes "
                f"that step again")
            continue
        problem = verify(path)
        if problem:
            log(f"checkpoint {path} is corrupt ({problem}); falling back to the previous one")
            continue
        if identity is not None:
            saved = json.loads((path / "state.json").read_text())
            if saved.get("fingerprint") != fingerprint(identity):
                stale = sorted(ckpt_dir.glob("step_*"))
                theirs = saved.get("identity") or {}
                differ = [k for k in sorted(set(identity) | set(theirs)) if identity.get(k) != theirs.get(k)]
                why = ", ".join(differ) if theirs else "settings, initial weights or data"
                log(f"not resuming from the checkpoints in {ckpt_dir}: they belong to another run of this job (other "
                    f"{why}); removing {len(stale)} of them and starting from the beginning")
                if _rank() == 0:  # that run's kept states too (its decay start, its branches' states)
                    for old in [*stale, ckpt_dir / DECAY_START, *ckpt_dir.glob(f"{BRANCH_PREFIX}*")]:
                        shutil.rmtree(old, ignore_errors=True)
                if dist.is_available() and dist.is_initialized():
                    dist.barrier()
                return None
        state = restore(path, model, optimizer)
        log(f"resumed from checkpoint {path.name} (step {state['step']})")
        return state
    return None


def start_branch(path: str | Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, *,
                 identity: dict[str, str], step: int) -> dict:
    """Restore the state a cooldown branch leaves from (a checkpoint another run kept, `BRANCH_PREFIX`)
    into `model` and `optimizer`, once it is checked: whole, of the run whose identity is `identity` (its
    settings, initial weights and data: `run_identity` of the model before this call), and at `step`
    (where the branch's decay begins). Returns its state; anything else is a one-line GrowlmError."""
    path = Path(path)
    problem = verify(path) if path.is_dir() else "it is missing"
    if problem:
        raise GrowlmError(f"the state this cooldown branches from ({path}) is unusable ({problem}); run the "
                          f"workflow again to retrain the run it leaves: `{hints.again()}`")
    saved = json.loads((path / "state.json").read_text())
    if saved.get("fingerprint") != fingerprint(identity) or saved.get("step") != step:
        raise GrowlmError(f"the state in {path} is not that of this branch's run at step {step} (other settings, "
                          f"initial weights, data or step); rerun that run: `{hints.rebuild(path / MANIFEST)}`")
    return restore(path, model, optimizer)


def restore(path: str | Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """Load the checkpoint at `path` (verified by the caller) into `model` and `optimizer`; return its
    state."""
    path = Path(path)
    tensors = load_file(path / "model.safetensors")
    core = getattr(model, "module", model)  # DDP: the checkpoint holds the unwrapped names
    if is_fsdp(core):
        missing, unexpected = set_model_state_dict(
            core, tensors, options=StateDictOptions(full_state_dict=True, strict=False))
    else:
        missing, unexpected = core.load_state_dict(tensors, strict=False)
    saved = set(tensors)
    shared = {n for n, t in core.state_dict().items() if n not in saved}
    if unexpected or (set(missing) - shared):
        raise RuntimeError(f"checkpoint {path} does not fit the model "
                           f"(unexpected {unexpected[:3]}, missing {missing[:3]})")
    _optimizer_from_flat(optimizer, load_file(path / "optimizer.safetensors"),
                         json.loads((path / "optimizer.json").read_text()), core)
    return json.loads((path / "state.json").read_text())
