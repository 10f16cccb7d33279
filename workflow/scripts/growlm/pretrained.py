"""Members you already have: `members.pretrained`, each a local `save_pretrained` folder or a Hub id.

Such members are not trained. Before any job (`problems`, torch-free: it reads each member's
`config.json`, from the folder or through the Hub's file API) the workflow checks that every member is
a model of a family growlm grows, that they share one family, shape and vocabulary, and that their
tokenizers are one (their `tokenizer.json` files carry the same vocabulary, merges and special
tokens). The experiment's member width and depth (d0, L0) are then the members'; M_0 and M_1 are built
in the members' family and vocabulary, from the members' config resized to d1 and L1
(`growlm.model.build_model(like=...)`), so the baseline differs from the grown model in nothing but
its initialisation; the members' tokenizer encodes the corpus instead of a fitted one.

The import job (`import_member`, torch) loads each member with `AutoModelForCausalLM.from_pretrained`
(the same call for a folder and a Hub id, with `revision`), sets its dropout to zero (growlm trains
without dropout; a Hub GPT-2's config has 0.1), and saves it as a growlm model folder with its
tokenizer and a record of where it came from and what its training cost: growlm does not know that
cost, so it is the stated `members.cost` ({tokens: N} or {flops: X} per member) or unknown, in which
case the comparison reports only the ratio with the members free and says so.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path


from growlm.errors import GrowlmError
from growlm.flops import shape_flops, train_flops_per_token
from growlm.hub import hub_file
from growlm.shape import FAMILIES, ModelShape


def spec_of(item) -> dict:
    """{"where", "kind" (path | hf), "revision"} of one entry of members.pretrained: a string (an existing
    folder, or what can only be a path - absolute, relative with ./ or ../, more than one /; else a Hub
    id such as `gpt2` or `owner/name`) or a mapping with `path` or `hf` and an optional `revision`."""
    if isinstance(item, str):
        path_like = Path(item).is_dir() or item.startswith(("/", ".", "~")) or item.count("/") > 1
        return {"where": item, "kind": "path" if path_like else "hf", "revision": None}
    if not isinstance(item, dict) or sum(k in item for k in ("path", "hf")) != 1:
        raise GrowlmError(f"members.pretrained: {item!r}: a folder, a Hub id, or a mapping with path or hf")
    kind = "path" if "path" in item else "hf"
    return {"where": str(item[kind]), "kind": kind, "revision": item.get("revision")}


def member_file(spec: dict, name: str) -> Path | None:
    """A file of the member (config.json, tokenizer.json...): in its folder, or fetched from the Hub (its
    cache when the Hub cannot be used: growlm.hub); None if it has none. GrowlmError, at once and
    whole, for a Hub member that can be neither reached nor found in the cache."""
    if spec["kind"] == "path":
        path = Path(spec["where"]) / name
        return path if path.is_file() else None
    return hub_file(spec["where"], name, revision=spec.get("revision"), what="Hub member")


def shape_of_config(cfg: dict, where: str) -> ModelShape:
    """The ModelShape of a config.json (torch-free)."""
    family = cfg.get("model_type")
    if family not in FAMILIES:
        raise GrowlmError(f"{where}: a {family!r} model; growlm grows {' and '.join(FAMILIES)} models")
    if family == "gpt2":
        return ModelShape(n_embd=cfg["n_embd"], n_layer=cfg["n_layer"], n_head=cfg["n_head"],
                          vocab_size=cfg["vocab_size"], n_positions=cfg.get("n_positions", 1024),
                          n_inner=cfg.get("n_inner"), tie_word_embeddings=cfg.get("tie_word_embeddings", True))
    d, h = cfg["hidden_size"], cfg["num_attention_heads"]
    dh = cfg.get("head_dim") or d // h
    if dh * h != d:
        raise GrowlmError(f"{where}: {h} heads of {dh} do not make its width {d}; growlm grows models whose heads "
                          f"fill the width")
    return ModelShape(n_embd=d, n_layer=cfg["num_hidden_layers"], n_head=h, vocab_size=cfg["vocab_size"],
                      n_positions=cfg.get("max_position_embeddings", 2048), n_inner=cfg["intermediate_size"],
                      tie_word_embeddings=cfg.get("tie_word_embeddings", False), family="llama",
                      n_kv_head=cfg.get("num_key_value_heads") or h, attention_bias=cfg.get("attention_bias", False))


def read_member(item) -> dict:
    """{"spec", "config" (dict), "shape", "tokenizer" (a digest of what makes it the tokenizer)} of one
    member, or GrowlmError naming it and what is wrong."""
    spec = spec_of(item)
    where = spec["where"]
    if spec["kind"] == "path" and not Path(where).is_dir():
        raise GrowlmError(f"members.pretrained: {where!r}: no such folder")
    path = member_file(spec, "config.json")
    if path is None:
        raise GrowlmError(f"members.pretrained: {where!r}: no config.json (not a save_pretrained folder)")
    try:
        cfg = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise GrowlmError(f"members.pretrained: {where!r}: config.json does not load ({err})") from None
    shape = shape_of_config(cfg, f"members.pretrained: {where!r}")
    weights = [n for n in ("model.safetensors", "pytorch_model.bin", "model.safetensors.index.json")
               if spec["kind"] == "hf" or (Path(where) / n).is_file()]
    if not weights:
        raise GrowlmError(f"members.pretrained: {where!r}: no weights (model.safetensors)")
    return {"spec": spec, "config": cfg, "shape": shape, "tokenizer": tokenizer_digest(spec)}


def tokenizer_digest(spec: dict) -> str | None:
    """A digest of the tokenizer's vocabulary, merges and special tokens (formatting aside), or None when
    the member has no tokenizer.json (a slow tokenizer is converted by the import job)."""
    path = member_file(spec, "tokenizer.json")
    if path is None:
        return None
    try:
        tok = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise GrowlmError(f"members.pretrained: {spec['where']!r}: tokenizer.json does not load ({err})") from None
    model = tok.get("model", {})
    core = {"vocab": model.get("vocab"), "merges": model.get("merges"), "type": model.get("type"),
            "added": sorted((t.get("id"), t.get("content")) for t in tok.get("added_tokens", []))}
    return hashlib.sha256(json.dumps(core, sort_keys=True).encode()).hexdigest()


def problems(items: list, *, n_values: list[int], context: int) -> tuple[list[str], list[dict]]:
    """(the problems with the members, one line each; what was read of each member)."""
    out, read = [], []
    for item in items:
        try:
            read.append(read_member(item))
        except GrowlmError as err:
            out.append(str(err))
    if out or not read:
        return out, read
    first = read[0]
    for i, m in enumerate(read[1:], start=2):
        where = f"members.pretrained[{i - 1}] ({m['spec']['where']})"
        for what, a, b in (("family", first["shape"].family, m["shape"].family),
                           ("vocabulary size", first["shape"].V, m["shape"].V),
                           ("width", first["shape"].d, m["shape"].d), ("depth", first["shape"].L, m["shape"].L),
                           ("heads", first["shape"].h, m["shape"].h),
                           ("key/value heads", first["shape"].g, m["shape"].g),
                           ("MLP width", first["shape"].f, m["shape"].f)):
            if a != b:
                out.append(f"{where}: its {what} is {b}, member 1's {a}; members must be of one family and shape")
        if m["tokenizer"] != first["tokenizer"]:
            out.append(f"{where}: its tokenizer differs from member 1's ({first['spec']['where']}); the members must "
                       f"share one tokenizer (it encodes the corpus for every model)")
    for n in n_values:
        if n > len(read):
            out.append(f"n = {n}: members.pretrained names {len(read)} member(s); use n <= {len(read)}")
    s = first["shape"]
    if s.family == "gpt2" and context > s.T:
        out.append(f"model.context = {context}: longer than the members' {s.T} positions")
    return out, read


def member_cost_flops(cost: dict | None, shape: ModelShape, context: int) -> float | None:
    """The stated training cost of one member in FLOPs (`members.cost`), or None (unknown)."""
    if not cost:
        return None
    if cost.get("flops") is not None:
        return float(cost["flops"])
    return float(cost["tokens"]) * train_flops_per_token(context=context, **shape_flops(shape))
