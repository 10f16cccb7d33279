# What each job reads: the input functions of the rules (the files a job waits for; Snakemake
# reruns it when they change). No rules here.

from pathlib import Path

from growlm.experiment import canonical, member_source, source_settings, trunk_tokens
from growlm.methods import is_single_member_control, members_used
from growlm.outputs import content_digest
from growlm.pretrained import spec_of as pretrained_spec
from growlm.sources import local_files

# Inputs from outside the workflow (a member's folder, a local corpus file, a task folder, a plugin file)
# are known by their content, not their file dates: each is marked `ancient` (its date never reruns
# anything) and its content digest (growlm.outputs.content_digest) stands in the job's params, so a change
# of content reruns exactly the jobs that read it, and a copy or a touch without a change reruns nothing.
# The same holds for an imported member's files that other jobs read only for what they share with every
# member (its tokenizer, its config): a change of another part of member 1 (its weights) reruns its import
# and the arms grown from it, never the tokenizer, the token files or M_0.


def content(files):
    """The content digest of `files` (cached by file stamps in the experiment's folder)."""
    return content_digest(files, R)


def _member_files(i):
    spec = pretrained_spec(PRETRAINED_MEMBERS[i - 1])
    if spec["kind"] != "path":
        return []
    return sorted(str(p) for p in Path(spec["where"]).iterdir() if p.is_file())


def pretrained_files(wildcards):
    """The local files a pretrained member is imported from (none for a Hub id: its revision is its
    identity), by content."""
    return [ancient(f) for f in _member_files(int(wildcards.member))]


def pretrained_content(wildcards):
    """The content digest of a member's local files (a Hub id: its revision)."""
    return content(_member_files(int(wildcards.member)))


def member_part_digest(name):
    """The digest of one file of member 1's own folder (its tokenizer.json, config.json), or of the Hub
    id for a Hub member: what the tokenizer and M_0 take from the members."""
    files = [f for f in _member_files(1) if Path(f).name == name]
    return content(files) if files else canonical(PRETRAINED_MEMBERS[0])


def like_config(wildcards):
    """M_0 is built like the pretrained members (their config, resized): it waits for member 1's import,
    but only a change of member 1's config reruns it (`like_digest`)."""
    return [ancient(f"{PRETRAINED.format(member=1)}/config.json")] if PRETRAINED_MEMBERS else []


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
        return [bundled_path(src["bundled"])]
    if src.get("url"):
        return [f"{R}/downloads/{wildcards.source}.txt"]
    spec = src.get("path") or src["hf"]
    return [ancient(str(f)) for f in local_files(spec)] if src.get("path") or Path(spec).is_dir() else []


def source_params(wildcards):
    """What the job preparing a source reads (growlm.experiment.source_settings), and for a local file or
    folder, the digest of its content (its dates never rerun it)."""
    src = SOURCES[wildcards.source]
    settings = source_settings(config, src)
    local = src.get("path") or (src.get("hf") and Path(str(src["hf"])).is_dir())
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
