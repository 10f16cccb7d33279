# The checks around your run (the config itself is checked first, in config.smk): the notice about
# a run that was killed and left Snakemake's lock; the preflight, before Snakemake plans any job
# (damaged or vanished outputs, settings changed since the last finished run, warnings, the
# benchmark tasks against lm-evaluation-harness); the plugin operators, grown for real before the
# first job (onstart); and the record of what made the results, after a finished run (onsuccess).
# No rules here.

import os
import sys
from pathlib import Path

from snakemake.exceptions import WorkflowError

from growlm import hints, outputs
from growlm.errors import GrowlmError
from growlm.hub import PREPARE, go_offline, offline_set
from growlm.interrupted import interrupted_run_notice
from growlm.sources import hub_problem
from growlm.tasks import task_problems
from growlm.train_config import export_compile
from growlm.sizing import experiment_warnings
from growlm.validate import check_plugin_operators

# train.compile for the jobs that train outside a training rule's params (a schedule's stages in the grow
# job, growlm.jobs.grow.grow_schedule): how a job runs, inherited through the environment, never a rerun trigger
export_compile(config["train"]["compile"])

# a run killed before this one left its lock: say how to continue (Snakemake checks the lock next)
NOTICE = interrupted_run_notice(Path.cwd(), sys.argv)
if NOTICE:
    print(NOTICE, file=sys.stderr)


def preflight():
    """The checks of the user's run (a job's step skips them), before Snakemake plans any job:

    - a file a job recorded a sha256 for that no longer matches it, or a tokenizer or growth record
      that no longer parses, stops the run naming it and the one line that rebuilds it and continues
      (a job would notice only after Snakemake had deleted the outputs it was rerun for);
    - outputs of a finished run that are gone are said to be made again (they are targets of `all`);
      `--report` stops instead of describing models that no longer exist;
    - settings changed since the folder's last finished run, and legal but surprising values
      (growlm.sizing.experiment_warnings), are printed as warnings."""
    forced = set(COMMAND["targets"]) if {"force", "forceall"} & set(COMMAND["given"]) else set()
    damaged = [(path, why) for path, why in outputs.damaged_files(R) if hints.rebuild_target(path) not in forced]
    if damaged:
        lines = [f"{path} is damaged ({why})" for path, why in damaged]
        raise WorkflowError(
            "; ".join(lines) + f"; rebuild {'it' if len(lines) == 1 else 'them'} and continue with "
            f"`{hints.rebuild(*[path for path, _ in damaged])}`"
        )
    if os.path.exists(res("eval/comparison.csv")):
        gone = outputs.gone(R, kept_outputs())  # made by the last finished run, and missing now
        if gone:
            listed = ", ".join(gone[:5]) + (f" and {len(gone) - 5} more" if len(gone) > 5 else "")
            if "report" in COMMAND["given"]:
                raise WorkflowError(
                    f"{len(gone)} output(s) of this experiment are gone ({listed}); the report would describe "
                    f"models that no longer exist. Make them again with `{hints.again()}`, then build the report"
                )
            print(
                f"growlm: {len(gone)} output(s) of this experiment's finished run are gone ({listed}); this run "
                "makes them again, and everything that depends on them",
                file=sys.stderr,
            )
    for i, source in enumerate(config["corpus"]["sources"]):
        # a Hub dataset not yet prepared: asked of the Hub now, not by a job that would retry
        if source.get("hf") and not Path(source["hf"]).is_dir():
            if not os.path.exists(res(f"corpus/sources/{source['name']}/source.json")):
                problem = hub_problem(source)
                if problem and not DRY_RUN:
                    raise WorkflowError(f"config error: corpus.sources[{i}] ({source['name']}): {problem}")
                if problem:  # a dry run only plans: say it, the real run stops here
                    print(f"growlm: warning: corpus.sources[{i}] ({source['name']}): {problem}", file=sys.stderr)
    changed, made_by = outputs.drift(R, config)
    if changed:
        keys = ", ".join(changed[:6]) + (f" and {len(changed) - 6} more" if len(changed) > 6 else "")
        print(
            f"growlm: warning: {R}/ holds the experiment '{EXPERIMENT}' made with other settings ({keys}; made by "
            f"{' '.join(made_by) or 'the default config'}); this run rebuilds what they change in place. To keep "
            f"both, give this one its own name: --config experiment=NAME (its results go to results/NAME/)",
            file=sys.stderr,
        )
    for warning in experiment_warnings(config, SWEEP, resolve_source=source_file, results=R):
        print(f"growlm: warning: {warning}", file=sys.stderr)


def hub_inputs():
    """What of this run comes from the Hugging Face Hub: Hub datasets, Hub members, registry tasks."""
    sources = [s["name"] for s in config["corpus"]["sources"] if s.get("hf") and not Path(str(s["hf"])).is_dir()]
    members = [str(m) for m in PRETRAINED_MEMBERS if pretrained_spec(m)["kind"] == "hf"]
    tasks = [tid for tid, spec in TASKS.items() if not spec.get("folder")]
    return sources + members + tasks


if MAIN_PROCESS:
    # the Hub, asked once (growlm.hub): when it cannot be used, every job reads its local cache at once
    # (HF_HUB_OFFLINE=1), and what is not there stops the run before any job, whole, naming it
    if hub_inputs() and not offline_set():
        REASON = go_offline()
        if REASON:
            print(
                f"growlm: {REASON}: every job reads the Hub's local cache ({', '.join(hub_inputs())}); "
                f"prepare what is missing where there is a network with `{PREPARE}`",
                file=sys.stderr,
            )
    try:
        preflight()
    except GrowlmError as err:
        raise WorkflowError(str(err))
    # every task entry against lm-evaluation-harness's registry and the given folders (nothing to do
    # when evaluate.tasks is empty; the registry's names are cached per version of the harness)
    try:
        PROBLEMS = task_problems(config["evaluate"]["tasks"])
    except GrowlmError as err:
        PROBLEMS = [str(err)]
    if PROBLEMS:
        raise WorkflowError("config error: " + "; ".join(PROBLEMS))


onstart:
    # import the plugins for real and grow tiny random members with each of their operators, before
    # any job: a broken plugin stops here, naming the file (growlm.validate.check_plugin_operators)
    if PLUGINS:
        try:
            print(check_plugin_operators(config, SWEEP, res("plugins/check.json")), file=sys.stderr)
        except GrowlmError as err:
            raise WorkflowError(str(err))


onsuccess:
    # what made this folder's results, for the next run's warning about changed settings
    made = [p for p in kept_outputs() if os.path.exists(p)]  # (a run of some targets made only those)
    outputs.record(R, config, workflow.overwrite_configfiles or workflow.configfiles, made=made)
