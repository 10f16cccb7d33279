# What you can ask for besides the whole run (the Snakefile's `all`), once the config is checked and the paths
# are known. The files of each stage's named target (the rules members, grown, baseline and refined, beside
# `all` in the Snakefile), and `--until RULE` planning RULE's jobs. No rules here.

from snakemake.dag import DAG
from snakemake.io import is_flagged


def stage_dirs(*kinds):
    """The model folders of the sweep of the given kinds (small, pretrained, baseline, refined)."""
    return [d for d in model_dirs() if Path(d).relative_to(R).parts[1] in kinds]


def stage_targets(*kinds):
    """Every model of those folders and its ledger (an imported member has none)."""
    dirs = stage_dirs(*kinds)
    ledgers = [f"{d}/ledger.csv" for d in dirs if "/models/pretrained/" not in d]
    return [f"{d}/model.safetensors" for d in dirs] + ledgers


def request_until_outputs():
    """Make `--until RULE` plan RULE's jobs whose outputs are missing, where Snakemake 9.27.1 plans none of
    them once the token files exist (`--until train_small` said "Nothing to be done" with no member trained).

    Why: the token files are the outputs of the checkpoint `encode_split` (rules/tokenizer.smk), and every
    training job reads them. `--until` first plans the whole DAG towards `all`, where a job with a missing
    output needs to run because the job after it asks for that file; it then keeps only the jobs of the named
    rules and what they depend on. With the checkpoint's outputs present, Snakemake next updates the
    checkpoint's dependencies: every job that reads a token file is rebuilt as a new job (its reason to run
    is lost with the old one) and the DAG is planned again (`DAG.update_checkpoint_dependencies`, since
    Snakemake's fix of its issues #2233 and #2824). In that second plan the until jobs are the targets, and a
    target job of a rule with wildcards needs to run only for the outputs the jobs after it ask for
    (`DAG.update_needrun`): those jobs were just removed, so it asks for nothing, and a training job with no
    output at all is taken as done. A target that is not rebuilt keeps its first reason, which is why
    `--until grow` and `--until train_baseline` still planned while level 1's tokens were not made yet (a job
    before them still had to run), and `--until train_small` never did: its jobs read the members' tokens,
    which existed. `--until FILE` was never affected: Snakemake adds an until file to the target files, and a
    target job always asks for those of its outputs that are target files.

    The fix does that for `--until RULE` too: once Snakemake has set the until jobs as the targets, their
    outputs join the target files, so each of those jobs needs to run exactly when one of its own outputs
    is missing (or, as before, its inputs or settings changed), in the first plan and in every plan after a
    checkpoint. Temporary outputs are left out: a large job's states for its cooldown branches are deleted
    once the branches have read them, and asking for them would train a finished M_0 again. A job that runs
    keeps them all the same (Snakemake deletes no temporary output of a target job), for the run that goes
    on from there. It changes nothing without `--until`."""
    set_until_jobs = getattr(DAG, "set_until_jobs", None)  # Snakemake's, pinned in pyproject.toml
    if set_until_jobs is None or getattr(set_until_jobs, "growlm_requests_outputs", False):  # parsed again here
        return

    def set_until_jobs_and_request_their_outputs(self):
        set_until_jobs(self)
        if self.untilrules:
            outputs = {str(f) for job in self.targetjobs for f in job.output if not is_flagged(f, "temp")}
            self.targetfiles = set(self.targetfiles) | outputs

    set_until_jobs_and_request_their_outputs.growlm_requests_outputs = True
    DAG.set_until_jobs = set_until_jobs_and_request_their_outputs


request_until_outputs()
