"""Members you already have: `members.pretrained`, each a local `save_pretrained` folder or a Hub id.

Such members are not trained. Before any job (`problems`, torch-free: it reads each member's
`config.json`, from the folder or through the Hub's file API) the workflow checks that every member is
a model of a family growlm grows, that they share one family, shape and vocabulary, and that their
tokenizers are one (their `tokenizer.json` files carry the same vocabulary, merges and special
tokens). The experiment's member width and depth (d0, L0) are then the members'; M_0 and M_1 are built
in the members' family and vocabulary, from the members' config resized to d1 and L1
(`growlm.model.build_model(like=...)`), so the baseline differs from the grown model in nothing but
its initialisation; the members' tokenizer encodes the corpus instead of a fitted one.

What would otherwise fail in a job, or later and elsewhere, is named there too, member by member
(`label`: "member 2 (members.pretrained, PATH)", numbered from 1 like the import jobs' folders): a member
without tokenizer files, or whose tokenizer.json does not parse (`tokenizers`, torch-free); weights
that do not match their config.json (read from the safetensors header alone, `safetensors_header`: a
config that says 400 tokens over weights for 420 would make from_pretrained fail in the import job, or
silently re-initialise what does not fit). A member stored in another dtype than float32 (bfloat16,
float16) is legal: growlm trains in float32 and the import converts it, which the config check says in
one warning line per member (`warn_before_jobs`) and the import job logs.

What a family's config.json holds, and which tensors its config fixes, is the family's description
(`growlm.family_specs`); nothing here tests a family's name. Families whose blocks are Llama's and that
differ from it only in configuration are read as Llama (the llama description's `read_as` and
`translate`): Qwen2 (biases on q, k and v) and Mistral without a sliding window shorter than the
context. The import job rebuilds them as a `LlamaForCausalLM` (`growlm.families.Family.adopt`) with the same
weights and checks on a few tokens that its logits are the member's, so everything downstream (the
growth operators, M_0 built like the members) sees one family.

The import job (`import_member`, torch) loads each member with `AutoModelForCausalLM.from_pretrained`
(the same call for a folder and a Hub id, with `revision`), sets its dropout to zero (growlm trains
without dropout; a Hub GPT-2's config has 0.1), and saves it as a growlm model folder with its
tokenizer and a record of where it came from and what its training cost: growlm does not know that
cost, so it is the stated `members.cost` ({tokens: N} or {flops: X} per member) or unknown, in which
case the comparison reports only the ratio with the members free and says so.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import re
import struct
import sys
from collections import Counter
from pathlib import Path

from huggingface_hub import try_to_load_from_cache
from tokenizers import Tokenizer

from growlm.errors import GrowlmError
from growlm.flops import shape_flops, train_flops_per_token
from growlm.hints import is_job_step
from growlm.hub import hub_file
from growlm.family_specs import FAMILY_SPECS, grown_model_types, spec_for_model_type
from growlm.shape import ModelShape

TOKENIZER_FILES = "tokenizer.json, or tokenizer_config.json with vocab/merges files"
SLOW_TOKENIZER_FILES = (("vocab.json", "merges.txt"), ("tokenizer.model",))  # what AutoTokenizer converts
SAFETENSORS_FLOATS = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
                      "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2"}
EXACT_IN_FLOAT32 = ("float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2")  # every value is a float32
BLOCK_INDEX = re.compile(r"(?:^|\.)(?:h|layers)\.(\d+)\.")  # transformer.h.3.attn..., model.layers.3.mlp...


def label(number: int, where) -> str:
    """How every message names a member: `member 2 (members.pretrained, models/b)`, numbered from 1 like
    the import jobs' folders (models/pretrained/m2)."""
    return f"member {number} (members.pretrained, {where})"


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
    return _hub_file(spec["where"], name, spec.get("revision"))  # asked of the Hub once per run


@functools.lru_cache(maxsize=64)
def _hub_file(where: str, name: str, revision: str | None) -> Path | None:
    return hub_file(where, name, revision=revision, what="Hub member")


def hub_identity(spec: dict) -> dict:
    """What a Hub member is now: its id, its revision, and the commit that revision resolves to (the
    snapshot its config.json comes from; the local cache's when the Hub cannot be used), so that a
    revision that names another commit, or a branch that moved, is a new member."""
    path = member_file(spec, "config.json")
    return {"hf": spec["where"], "revision": spec.get("revision"), "commit": path.parent.name if path else None}


# the files of a member that make its tokenizer (AutoTokenizer reads a tokenizer.json, or converts a slow
# tokenizer's files; tokenizer_config.json says its class and special tokens)
TOKENIZER_PARTS = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "vocab.json", "merges.txt", "tokenizer.model")


def shape_of_config(cfg: dict, where: str, *, context: int | None = None) -> ModelShape:
    """The ModelShape of a config.json (torch-free), read by its family's description
    (`growlm.family_specs.FamilySpec.read`); a model type a family reads as its own (`read_as`: a
    llama) is translated first (`translate`), and refused if its sliding window is shorter than `context`
    (model.context; None: not checked)."""
    model_type = cfg.get("model_type")
    spec = spec_for_model_type(model_type, read_as=True)
    if spec is None:
        reads = [f"{' and '.join(s.read_as)} models as {s.name}" for s in FAMILY_SPECS.values() if s.read_as]
        raise GrowlmError(f"{where}: a {model_type!r} model; growlm grows {grown_model_types()} models"
                          + (f" (and reads {'; '.join(reads)})" if reads else ""))
    if model_type in spec.read_as:
        cfg = spec.translate(cfg, where, context=context)
    return ModelShape(**spec.read(cfg, where))


def read_member(item, number: int, *, context: int) -> dict:
    """{"spec", "label", "config" (dict), "shape", "tokenizer" (what makes it the tokenizer), "dtype" (of
    its stored weights, or None)} of member `number` (from 1), or GrowlmError naming it and what is
    wrong: its folder, config.json, weights (their safetensors header against the config) and tokenizer
    files, each as the import job would need them."""
    try:
        spec = spec_of(item)
    except GrowlmError:
        raise GrowlmError(f"member {number} (members.pretrained): {item!r} is not a folder, a Hub id, or a mapping "
                          f"with path or hf (and an optional revision)") from None
    where = spec["where"]
    name = label(number, where)
    if spec["kind"] == "path" and not Path(where).is_dir():
        raise GrowlmError(f"{name}: no such folder")
    try:
        path = member_file(spec, "config.json")
    except GrowlmError as err:  # a Hub member that cannot be read
        raise GrowlmError(f"{name}: {err}") from None
    if path is None:
        raise GrowlmError(f"{name}: no config.json (not a save_pretrained folder)")
    try:
        cfg = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise GrowlmError(f"{name}: its config.json does not load ({err})") from None
    try:
        shape = shape_of_config(cfg, name, context=context)
    except (KeyError, TypeError, ValueError) as err:  # a key missing, or of the wrong kind
        raise GrowlmError(f"{name}: its config.json does not describe a model ({type(err).__name__}: {err}); save "
                          f"it again with the model (save_pretrained)") from None
    weights = [n for n in ("model.safetensors", "pytorch_model.bin", "model.safetensors.index.json",
                           "pytorch_model.bin.index.json") if spec["kind"] == "hf" or (Path(where) / n).is_file()]
    if not weights:
        raise GrowlmError(f"{name}: no weights (model.safetensors)")
    header = weights_header(spec, name)
    if header:
        wrong = weight_problems(header, shape)
        if wrong:
            raise GrowlmError(f"{name}: its weights do not match its config.json ({'; '.join(wrong[:3])}); save the "
                              f"model with the config it was trained with (save_pretrained)")
    return {"spec": spec, "label": name, "config": cfg, "shape": shape, "tokenizer": tokenizer_identity(spec, name),
            "dtype": stored_dtype(header, cfg)}


def safetensors_header(path: Path) -> dict:
    """{tensor name: {"dtype", "shape", "data_offsets"}} of a safetensors file, from its header alone (8
    bytes giving the header's length, little-endian, then that many bytes of JSON): torch-free, and
    without reading the weights. ValueError, saying why, for a file that is not one or is cut short."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ValueError(f"{size} bytes, too few for a safetensors header")
        (n,) = struct.unpack("<Q", head)
        if n > size - 8:
            raise ValueError(f"its header would be {n} bytes long and the file has {size}: not a safetensors file")
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise ValueError("its header is not JSON: not a safetensors file") from None
    if not isinstance(header, dict):
        raise ValueError("its header is not a table of tensors: not a safetensors file")
    header.pop("__metadata__", None)
    try:
        end = max((int(t["data_offsets"][1]) for t in header.values()), default=0)
        for t in header.values():
            t["shape"], t["dtype"] = [int(k) for k in t["shape"]], str(t["dtype"])
    except (KeyError, IndexError, TypeError, ValueError):
        raise ValueError("its header does not describe tensors: not a safetensors file") from None
    if 8 + n + end > size:
        raise ValueError(f"cut short: its tensors need {8 + n + end} bytes and the file has {size}")
    return header


def weights_header(spec: dict, name: str) -> dict | None:
    """The safetensors headers of a member's weights, one table (a sharded checkpoint's shards, as its
    model.safetensors.index.json names them); None where they cannot be read torch-free and without a
    download: pytorch_model.bin, or a Hub member whose model.safetensors is not in the local cache
    (the import job's from_pretrained checks those). GrowlmError naming a file that is not readable."""
    if spec["kind"] == "hf":
        cached = try_to_load_from_cache(spec["where"], "model.safetensors", revision=spec.get("revision"))
        files = [Path(cached)] if isinstance(cached, str) else []
    else:
        folder = Path(spec["where"])
        files = [folder / "model.safetensors"] if (folder / "model.safetensors").is_file() else []
        index = folder / "model.safetensors.index.json"
        if not files and index.is_file():
            try:
                shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
            except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, AttributeError, TypeError) as err:
                raise GrowlmError(f"{name}: its model.safetensors.index.json does not load ({err!r})") from None
            missing = [s for s in shards if not (folder / s).is_file()]
            if missing:
                raise GrowlmError(f"{name}: its model.safetensors.index.json names {missing[0]}, which is not in the "
                                  f"folder; copy every shard of the checkpoint")
            files = [folder / s for s in shards]
    header = {}
    for path in files:
        try:
            header.update(safetensors_header(path))
        except (OSError, ValueError) as err:
            raise GrowlmError(f"{name}: its {path.name} does not load ({err}); save the model again "
                              f"(save_pretrained)") from None
    return header or None


def _dims(shape) -> str:
    return " x ".join(str(k) for k in shape)


def weight_problems(header: dict, shape: ModelShape) -> list[str]:
    """Where a member's weights disagree with the shape its config.json gives, one phrase each: the
    tensors whose shapes the config fixes (the token embedding, an untied head, GPT-2's positions, the
    first block's query, key/value and MLP projections) and the number of blocks."""
    s = shape
    want, depth = s.spec.weights(s), s.spec.keys["n_layer"]  # what the family's config fixes
    out = []
    for suffix, expected, what in want:
        for name, t in header.items():
            if (name == suffix or name.endswith("." + suffix)) and tuple(t["shape"]) != expected:
                out.append(f"{name} is {_dims(t['shape'])}, where its {what} make {_dims(expected)}")
    blocks = {int(m.group(1)) for m in map(BLOCK_INDEX.search, header) if m}
    if blocks and len(blocks) != s.L:
        out.append(f"they hold {len(blocks)} blocks, its {depth} says {s.L}")
    return out


def stored_dtype(header: dict | None, cfg: dict) -> str | None:
    """The dtype a member's weights are stored in ("bfloat16", ...; "bfloat16 and float32" when mixed):
    its safetensors header's floating-point tensors, else its config's `dtype` (`torch_dtype` before
    transformers 5); None when neither says."""
    kinds = Counter(SAFETENSORS_FLOATS.get(t["dtype"], t["dtype"].lower()) for t in (header or {}).values()
                    if t["dtype"].startswith(("F", "BF")))
    if kinds:
        return " and ".join(sorted(kinds))
    said = cfg.get("dtype") or cfg.get("torch_dtype")
    return str(said).removeprefix("torch.") if isinstance(said, str) else None


def dtype_warning(member: dict) -> str | None:
    """The one line that says a member is not stored in float32 and is converted (growlm trains in
    float32), or None."""
    dtype = member.get("dtype")
    if dtype in (None, "float32"):
        return None
    exact = all(part in EXACT_IN_FLOAT32 for part in dtype.split(" and "))
    how = "exactly: every such value is a float32 value" if exact else "rounded to float32's precision"
    return f"{member['label']}: its weights are {dtype}; growlm trains in float32, so the import converts them to " \
           f"float32 ({how})"


def warn_before_jobs(read: list[dict], extra: list[str] = ()) -> list[str]:
    """The members' warnings (`dtype_warning`, and `extra`: config values the members override), printed as
    growlm's warnings in the user's run (not in a job's step, which parses the Snakefile again); returned
    too."""
    lines = [*extra, *(w for w in map(dtype_warning, read) if w)]
    if not is_job_step(sys.argv):
        for line in lines:
            print(f"growlm: warning: {line}", file=sys.stderr)
    return lines


def _tokenizer_core(tok: dict) -> str:
    model = tok.get("model", {})
    core = {"vocab": model.get("vocab"), "merges": model.get("merges"), "type": model.get("type"),
            "added": sorted((t.get("id"), t.get("content")) for t in tok.get("added_tokens", []))}
    return hashlib.sha256(json.dumps(core, sort_keys=True).encode()).hexdigest()


@functools.lru_cache(maxsize=4)
def _parsed_tokenizer(text: str) -> str:
    """The digest (`_tokenizer_core`) of a tokenizer.json's text that parses as a tokenizer; parsed once
    for members that share one (a large vocabulary takes a fraction of a second)."""
    Tokenizer.from_str(text)
    return _tokenizer_core(json.loads(text))


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
    return _tokenizer_core(tok)


def tokenizer_identity(spec: dict, name: str) -> str:
    """What makes a member's tokenizer the one it is, "FILES:digest", compared across the members; or
    GrowlmError naming the member and the files looked for. A tokenizer.json must parse as a tokenizer
    (`tokenizers.Tokenizer`, as the import job's AutoTokenizer reads it; its digest is that of
    `tokenizer_digest`); without one, a slow tokenizer's files beside a tokenizer_config.json (which
    says their class): vocab.json and merges.txt, or a SentencePiece tokenizer.model, which the import
    job converts into a tokenizer.json."""
    path = member_file(spec, "tokenizer.json")
    if path is not None:
        try:
            core = _parsed_tokenizer(path.read_text())
        except Exception as err:  # noqa: BLE001 - unreadable, not JSON, or not a tokenizer (tokenizers' own error)
            first = (str(err).strip().splitlines() or [type(err).__name__])[0]
            raise GrowlmError(f"{name}: its tokenizer.json does not load ({first}); save its tokenizer again "
                              f"(tokenizer.save_pretrained)") from None
        return f"tokenizer.json:{core}"
    if member_file(spec, "tokenizer_config.json") is not None:
        for names in SLOW_TOKENIZER_FILES:
            paths = [member_file(spec, n) for n in names]
            if all(paths):
                if names == ("tokenizer.model",) and importlib.util.find_spec("sentencepiece") is None:
                    raise GrowlmError(f"{name}: its tokenizer is a SentencePiece tokenizer.model, which loads only "
                                      f"with the sentencepiece package (pip install sentencepiece); or give it a "
                                      f"tokenizer.json")
                digest = hashlib.sha256(b"".join(p.read_bytes() for p in paths)).hexdigest()
                return f"{' and '.join(names)}:{digest}"
    raise GrowlmError(f"{name}: no tokenizer files ({TOKENIZER_FILES}); save its tokenizer with it "
                      f"(tokenizer.save_pretrained)")


# keys of a config.json that do not change what its model computes in growlm (in float32, without dropout:
# growlm zeroes it): bookkeeping, token ids (the tokenizers are compared on their own), the initialisation,
# generation defaults, the heads of other tasks; and keys that the shape comparison already names
NOT_FUNCTION = {"architectures", "transformers_version", "dtype", "torch_dtype", "use_cache", "output_attentions",
                "output_hidden_states", "return_dict", "torchscript", "initializer_range", "tokenizer_class",
                "id2label", "label2id", "task_specific_params", "problem_type", "prefix", "finetuning_task",
                "pruned_heads", "chunk_size_feed_forward", "tie_encoder_decoder", "is_encoder_decoder", "is_decoder",
                "add_cross_attention", "cross_attention_hidden_size", "use_bfloat16", "tf_legacy_loss", "n_ctx",
                "auto_map", "max_length", "min_length", "do_sample", "early_stopping", "num_beams", "temperature",
                "top_k", "top_p", "repetition_penalty", "length_penalty", "no_repeat_ngram_size", "num_return_sequences",
                "bad_words_ids", "forced_bos_token_id", "forced_eos_token_id", "model_type"}
NOT_FUNCTION_ENDINGS = ("dropout", "pdrop", "token_id")
NOT_FUNCTION_STARTS = ("_", "summary_")  # private attributes; GPT-2's sequence-summary head (not the LM's)
ROPE_KEYS = ("rope_parameters", "rope_theta", "rope_scaling")  # rotary settings, in their three spellings
ROPE_THETA = 10000.0  # transformers' rotary base when a config gives none


def _rope(cfg: dict) -> dict | None:
    """A config's rotary settings as one dict (transformers 5 writes `rope_parameters`, earlier versions
    `rope_theta` and `rope_scaling`, whose kind is `type` or `rope_type`); None without rotary keys."""
    if not any(k in cfg for k in ROPE_KEYS):
        return None
    out = dict(cfg.get("rope_parameters") or {})
    if cfg.get("rope_theta") is not None:
        out.setdefault("rope_theta", cfg["rope_theta"])
    out.update(cfg.get("rope_scaling") or {})
    kind = out.pop("type", None)
    out.setdefault("rope_type", kind or "default")
    out.setdefault("rope_theta", ROPE_THETA)
    return out


def function_settings(cfg: dict, *, shape_keys: bool = True) -> dict:
    """The settings of a member's config.json (or a config's `to_dict()`) that change what its model
    computes: every key but those of NOT_FUNCTION (and, with `shape_keys` False, but the keys of its
    shape, which `problems` compares by name), a model type its family reads as its own translated
    first (Qwen2, Mistral: `FamilySpec.translate`), the rotary settings as one `rope` entry, a key left
    out taking the family's default (`FamilySpec.defaults`). A member growlm does not know is compared
    by all its keys: a setting growlm has never heard of is compared too, never ignored."""
    spec = spec_for_model_type(cfg.get("model_type"), read_as=True)
    if spec is not None and cfg.get("model_type") in spec.read_as:
        cfg = spec.translate(cfg, "a member", context=None)
    out = {spec.keys[k]: v for k, v in spec.defaults.items() if k in spec.keys} if spec else {}
    out.update({k: v for k, v in cfg.items() if v is not None})
    rope = _rope(out)
    out = {k: v for k, v in out.items() if k not in ROPE_KEYS and k not in NOT_FUNCTION
           and not k.endswith(NOT_FUNCTION_ENDINGS) and not k.startswith(NOT_FUNCTION_STARTS)}
    if rope is not None:
        out["rope"] = rope
    if not shape_keys and spec is not None:
        for key in ("vocab_size", "n_embd", "n_layer", "n_head", "n_kv_head", "n_inner", "attention_bias"):
            out.pop(spec.keys.get(key), None)
    return out


def setting_differences(first: dict, other: dict, *, shape_keys: bool = True) -> list[tuple[str, object, object]]:
    """[(setting, first's value, other's value)] where two configs' `function_settings` differ ("absent"
    for a setting one of them lacks)."""
    a, b = (function_settings(c, shape_keys=shape_keys) for c in (first, other))
    return [(k, a.get(k, "absent"), b.get(k, "absent")) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]


def _shown(key: str, value) -> str:
    return f"{'rotary settings' if key == 'rope' else key} {json.dumps(value, sort_keys=True, default=str)}"


def problems(items: list, *, n_values: list[int], context: int) -> tuple[list[str], list[dict]]:
    """(the problems with the members, one line each; what was read of each member)."""
    out, read = [], []
    for number, item in enumerate(items, start=1):
        try:
            read.append(read_member(item, number, context=context))
        except GrowlmError as err:
            out.append(str(err))
    if out or not read:
        return out, read
    first = read[0]
    for m in read[1:]:
        for what, a, b in (("family", first["shape"].family, m["shape"].family),
                           ("vocabulary size", first["shape"].V, m["shape"].V),
                           ("width", first["shape"].d, m["shape"].d), ("depth", first["shape"].L, m["shape"].L),
                           ("heads", first["shape"].h, m["shape"].h),
                           ("key/value heads", first["shape"].g, m["shape"].g),
                           ("MLP width", first["shape"].f, m["shape"].f),
                           ("attention biases", *("on" if x["shape"].attention_bias else "off" for x in (first, m)))):
            if a != b:
                out.append(f"{m['label']}: its {what} is {b}, member 1's {a}; members must be of one family and shape")
        # every other setting that changes what a member computes (rotary settings, positions, activation,
        # norm epsilon...): M_0 and the grown model are built from member 1's config, so another member's
        # setting would be dropped without a word (another family's settings are not compared: named above)
        same_family = m["shape"].family == first["shape"].family
        for key, a, b in setting_differences(first["config"], m["config"], shape_keys=False) if same_family else ():
            out.append(f"{m['label']}: its {_shown(key, b)} differs from member 1's ({_shown(key, a)}); growlm builds "
                       f"M_0 and the grown model from member 1's config, so the members must agree on every setting "
                       f"that changes what they compute")
        if m["tokenizer"] != first["tokenizer"]:
            files, first_files = m["tokenizer"].partition(":")[0], first["tokenizer"].partition(":")[0]
            if files != first_files:
                out.append(f"{m['label']}: its tokenizer is in {files}, member 1's in {first_files} "
                           f"({first['spec']['where']}); give every member the same tokenizer files (growlm compares "
                           f"them before any job: one tokenizer encodes the corpus for every model)")
            else:
                out.append(f"{m['label']}: its tokenizer differs from member 1's ({first['spec']['where']}); the "
                           f"members must share one tokenizer (it encodes the corpus for every model)")
    for n in n_values:
        if n > len(read):
            out.append(f"n = {n}: members.pretrained names {len(read)} member(s); use n <= {len(read)}")
    s = first["shape"]
    if s.learned_positions and context > s.T:  # a position table: no longer context than its rows
        out.append(f"model.context = {context}: longer than the members' {s.T} positions")
    return out, read


def member_cost_flops(cost: dict | None, shape: ModelShape, context: int) -> float | None:
    """The stated training cost of one member in FLOPs (`members.cost`), or None (unknown)."""
    if not cost:
        return None
    if cost.get("flops") is not None:
        return float(cost["flops"])
    return float(cost["tokens"]) * train_flops_per_token(context=context, **shape_flops(shape))
