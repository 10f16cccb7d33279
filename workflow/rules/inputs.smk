# What each job reads: the input functions of the rules (the files a job waits for; Snakemake
# reruns it when they change). No rules here.

import json
from pathlib import Path

from growlm.experiment import canonical, member_source, source_settings, trunk_tokens
from growlm.methods import is_single_member_control, members_used
from growlm.outputs import content_digest
from growlm.pretrained import TOKENIZER_PARTS, hub_identity
from growlm.pretrained import spec_of as pretrained_spec
from growlm.sources import local_files

# Inputs from outside the workflow (a local corpus file or bundled book, a task folder, a plugin file) are
# known by their content, not their file dates: each is marked `ancient` (its date never reruns
# anything) and its content digest (growlm.outputs.content_digest) stands in the job's params, so a change
# of content reruns exactly the jobs that read it, and a copy, a touch or a `cp -p` of the old file back
# reruns what reads it only when the content differs.
#
# A pretrained member (members.pretrained) is known by its content alone: its import declares no input
# files and gets its folder through a params function of its output (left out of the rerun trigger), so
# a member folder moved or linked elsewhere with the same content reruns nothing. What other jobs take
# from member 1 besides its weights - its tokenizer's files (the experiment's tokenizer) and its
# config (M_0 is built like it) - is known by its own digest, in a job of its own with no job before it
# (a file each, made by member_part); the tokenizer job and M_0 read the import's files `ancient` and
# the part's file plainly. Snakemake 9 checks the params of no job below one that must rerun, and an
# `ancient` link then skips it; a job with nothing before it is always checked, so a part that changed
# reruns what reads it in the same run that reimports the member, and a change of member 1's weights
# alone reruns its import and the arms grown from it, never the tokenizer, the token files or M_0.


def content(files):
    """The content digest of `files` (cached by file stamps in the experiment's folder)."""
    return content_digest(files, R)


def _member_files(i):
    spec = pretrained_spec(PRETRAINED_MEMBERS[i - 1])
    if spec["kind"] != "path":
        return []
    return sorted(str(p) for p in Path(spec["where"]).iterdir() if p.is_file())


def pretrained_where(wildcards, output):
    """Where a pretrained member is imported from (its entry of members.pretrained): a params function of
    the output, so that where it lies reruns nothing (`member_identity` is what it is)."""
    return canonical(PRETRAINED_MEMBERS[int(wildcards.member) - 1])


def member_identity(wildcards):
    """What a pretrained member is: a folder's content digest (its files' names and contents), or a Hub id
    with its revision and the commit that resolves to (growlm.pretrained.hub_identity)."""
    i = int(wildcards.member)
    spec = pretrained_spec(PRETRAINED_MEMBERS[i - 1])
    return {"content": content(_member_files(i))} if spec["kind"] == "path" else hub_identity(spec)


MEMBER_PARTS = {"tokenizer": TOKENIZER_PARTS, "config": ("config.json",)}


def member_part(wildcards):
    """What the experiment takes from member 1 as part `tokenizer` (its tokenizer's files) or `config`
    (its config.json): their content digest; a Hub member's id, revision and commit."""
    spec = pretrained_spec(PRETRAINED_MEMBERS[0])
    if spec["kind"] != "path":
        return hub_identity(spec)
    return content([f for f in _member_files(1) if Path(f).name in MEMBER_PARTS[wildcards.part]])


def write_member_part(out_file, part, identity, log_file):
    """Rule member_part's job: the identity of member 1's part in its file, which the jobs that read the
    part wait for (rewritten only when the identity changed: the job reruns only then)."""
    Path(out_file).write_text(
        json.dumps({"part": part, "files": list(MEMBER_PARTS[part]), "identity": identity}, indent=1, sort_keys=True)
        + "\n"
    )
    Path(log_file).write_text(f"member 1's {part}: {json.dumps(identity, sort_keys=True)}\n")


def like_config(wildcards):
    """M_0 is built like the pretrained members (their config, resized): it waits for member 1's import,
    but only a change of member 1's config reruns it (its `config` part, see above)."""
    if not PRETRAINED_MEMBERS:
        return []
    return [ancient(f"{PRETRAINED.format(member=1)}/config.json"), MEMBER_PART.format(part="config")]


def member_dirs(wildcards):
    """The n small members a grow job combines (m_1 n times for the single-member control)."""
    single = is_single_member_control(getattr(wildcards, "method", ""))
    c = dict(d0=wildcards.d0, L0=wildcards.L0, seed=wildcards.seed)
    return [small_dir(c, 1 if single else i) for i in range(1, int(wildcards.n) + 1)]


def source_dirs(wildcards):
    """The folders a grow job reads its members from (members.source): each member, or its model where
    its wsd decay began."""
    return [member_source(config, d) for d in member_dirs(wildcards)]


def member_models(wildcards):
    """The members a grow job reads: those its chain uses (m_1 alone for a single-source chain; none for
    a schedule), so that a change of m_2 never reruns an arm grown from m_1 alone."""
    dirs = source_dirs(wildcards)
    return [f"{d}/model.safetensors" for d in dirs[: members_used(wildcards.method, len(dirs))]]


def source_input(wildcards):
    """The local files a source is prepared from (none for a Hub id: its revision is its identity)."""
    src = SOURCES[wildcards.source]
    if src.get("bundled"):
        return [ancient(bundled_path(src["bundled"]))]
    if src.get("url"):
        return [f"{R}/downloads/{wildcards.source}.txt"]
    spec = src.get("path") or src["hf"]
    return [ancient(str(f)) for f in local_files(spec)] if src.get("path") or Path(spec).is_dir() else []


def source_params(wildcards):
    """What the job preparing a source reads (growlm.experiment.source_settings), and for a bundled book
    or a local file or folder, the digest of its content (its dates never rerun it)."""
    src = SOURCES[wildcards.source]
    settings = source_settings(config, src)
    local = src.get("bundled") or src.get("path") or (src.get("hf") and Path(str(src["hf"])).is_dir())
    return {**settings, "content": content(source_input(wildcards))} if local else settings


def level_sources(wildcards):
    return [f"{R}/corpus/sources/{name}/{f}" for name in level_source_names(wildcards) for f in SOURCE_FILES]


def trunk_model(wildcards):
    """The members' shared trunk a member branches from (members.trunk > 0), else nothing."""
    if not trunk_tokens(config):
        return []
    return f"{TRUNK.format(d0=wildcards.d0, L0=wildcards.L0, seed=wildcards.seed)}/model.safetensors"


def task_inputs(wildcards):
    """What a task run reads besides the model: the written folder of a bundled task, every file of a
    local task folder (editing its YAML reruns it); a registry task reads the Hub."""
    spec = TASKS[wildcards.task]
    if spec["bundled"]:
        return [f"{spec['folder']}/{wildcards.task}.yaml", f"{spec['folder']}/test.jsonl"]
    if spec["folder"]:
        return [ancient(f) for f in _task_files(spec)]
    return []


def _task_files(spec):
    return sorted(str(f) for f in Path(spec["folder"]).rglob("*") if f.is_file() and "__pycache__" not in f.parts)


def task_spec(wildcards):
    """A task job's entry (growlm.tasks.task_specs); for a folder of your own, with its content digest."""
    spec = TASKS[wildcards.task]
    if spec["folder"] and not spec["bundled"]:
        return {**spec, "content": content(_task_files(spec))}
    return spec


def profile_inputs(wildcards):
    """What a profiled run reads: the tokens of its kind, the tokenizer and, for M'_1, the grown model
    (of the first combination of the sweep)."""
    c = _first_combo()
    tokens = MEMBER_TOKENS if wildcards.kind == "small" else LARGE_TOKENS
    inputs = {"tokens": f"{tokens}/train.npy", "tokenizer": res("tokenizer/tokenizer.json")}
    if wildcards.kind == "refine":
        inputs["grown"] = f"{GROWN.format(**c)}/growth.json"
    return inputs
