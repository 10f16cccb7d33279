# What each job reads: the input functions of the rules (the files a job waits for; Snakemake
# reruns it when they change). No rules here.

from pathlib import Path

from growlm.experiment import trunk_tokens
from growlm.methods import SCHEDULES, is_single_member_control, members_used
from growlm.pretrained import spec_of as pretrained_spec
from growlm.sources import local_files


def pretrained_files(wildcards):
    """The local files a pretrained member is imported from (none for a Hub id)."""
    spec = pretrained_spec(PRETRAINED_MEMBERS[int(wildcards.member) - 1])
    if spec["kind"] != "path":
        return []
    return sorted(str(p) for p in Path(spec["where"]).iterdir() if p.is_file())


def like_config(wildcards):
    """M_0 is built like the pretrained members (their config, resized): it waits for member 1's import."""
    return [f"{PRETRAINED.format(member=1)}/config.json"] if PRETRAINED_MEMBERS else []


def member_dirs(wildcards):
    """The n small members a grow job combines (m_1 n times for the single-member control)."""
    single = is_single_member_control(getattr(wildcards, "method", ""))
    c = dict(d0=wildcards.d0, L0=wildcards.L0, seed=wildcards.seed)
    return [small_dir(c, 1 if single else i) for i in range(1, int(wildcards.n) + 1)]


def member_models(wildcards):
    """The members a grow job reads: those its chain uses (m_1 alone for a single-source chain; none for
    a schedule), so that a change of m_2 never reruns an arm grown from m_1 alone."""
    dirs = member_dirs(wildcards)
    return [f"{d}/model.safetensors" for d in dirs[: members_used(wildcards.method, len(dirs))]]


def source_input(wildcards):
    """The local files a source is prepared from (none for a Hub id: its revision is its identity)."""
    src = SOURCES[wildcards.source]
    if src.get("bundled"):
        return [bundled_path(src["bundled"])]
    if src.get("url"):
        return [f"{R}/downloads/{wildcards.source}.txt"]
    spec = src.get("path") or src["hf"]
    return [str(f) for f in local_files(spec)] if src.get("path") or Path(spec).is_dir() else []


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
        return sorted(str(f) for f in Path(spec["folder"]).rglob("*") if f.is_file() and "__pycache__" not in f.parts)
    return []


def profile_inputs(wildcards):
    """What a profiled run reads: the tokens of its kind, the tokenizer and, for M'_1, the grown model
    (of the first combination of the sweep)."""
    c = _first_combo()
    tokens = MEMBER_TOKENS if wildcards.kind == "small" else LARGE_TOKENS
    inputs = {"tokens": f"{tokens}/train.npy", "tokenizer": res("tokenizer/tokenizer.json")}
    if wildcards.kind == "refine":
        inputs["grown"] = f"{GROWN.format(**c)}/growth.json"
    return inputs
