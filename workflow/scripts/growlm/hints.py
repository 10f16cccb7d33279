"""The commands growlm prints for its user to run: always the user's own command line.

A hint such as "rebuild it with `snakemake --cores 1 --force FILE`" is only right for the default
experiment: run in a folder where the user works with `--configfile my.yaml`, it rebuilds a file of
*another* experiment (the default config's corpus and tokenizer), and for a file whose rule exists
only under the user's config it fails. So every command growlm prints is the command the user typed
(`--configfile`, `--config`, `--profile`, `--cores`, `--directory`, ...) with only what selects or
alters the jobs taken out (targets, `--force`, `--forcerun`, `--until`, `--report`, `-n`, ...) and
what the hint needs put in.

The Snakefile calls `export_command(sys.argv)` while Snakemake parses it: the command goes into the
environment (`GROWLM_COMMAND`), which every job inherits (local jobs are child processes; a SLURM job
inherits the submitting environment), so a job that finds a damaged input names the right command.
Outside the workflow (the library used on its own) the hints fall back to plain `snakemake --cores 1`.

Torch-free and Snakemake-free: the Snakefile hands in Snakemake's own option table, which tells
which words of the command line belong to which option.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path

COMMAND_ENV = "GROWLM_COMMAND"
FALLBACK = {"program": "snakemake", "args": ["--cores", "1"], "targets": [], "given": ["cores"]}

# options (Snakemake's argparse dests) that choose what runs or replace running; a hint drops them
_SELECTION = {
    "targets", "dryrun", "force", "forceall", "forcerun", "until", "omit_from", "report", "report_stylesheet",
    "report_after_run", "touch", "unlock", "list_changes", "summary", "detailed_summary", "delete_all_output",
    "delete_temp_output", "dag", "rulegraph", "filegraph", "d3dag", "lint", "cleanup_metadata", "list_rules",
    "list_target_rules", "target_jobs", "mode", "cleanup_shadow", "containerize", "generate_unit_tests", "archive",
    "conda_create_envs_only", "print_compilation", "export_cwl", "list_input_changes", "list_params_changes",
    "list_code_changes", "list_version_changes", "list_untracked", "help", "version", "batch", "edit_notebook",
}


def snakemake_program(argv: list[str]) -> str:
    """How Snakemake was started: its script (`.venv/bin/snakemake`) or `python -m snakemake`."""
    return argv[0] if Path(argv[0]).name == "snakemake" else f"{sys.executable} -m snakemake"


def option_table(parser) -> dict:
    """{option string: (dest, nargs)} of an argparse parser: Snakemake's own (`snakemake.cli.
    get_argument_parser()`, which the Snakefile passes in), so that the words each option takes are
    known exactly."""
    return {s: (a.dest, a.nargs) for s, a in parser._option_string_actions.items()}


def split_command(argv: list[str], options: dict | None = None) -> dict:
    """{"program", "args", "targets", "given"}: the user's Snakemake command line without the words
    that choose or replace what runs (`args`), the targets it named (`targets`) and the options it
    gave, by Snakemake's names for them (`given`: "dryrun", "report", ...; "--" when the targets followed a
    `--`). `options`: `option_table` of Snakemake's parser; without it an unknown option is taken to have at
    most one value."""
    options = options or {}
    args, targets, given, i = [], [], set(), 1
    while i < len(argv):
        word = argv[i]
        if word == "--":  # the end of the options: every word after it is a target
            targets += argv[i + 1:]
            given.add("--")
            break
        if not word.startswith("-") or word == "-":
            targets.append(word)
            i += 1
            continue
        name, _, inline = word.partition("=")
        if name not in options and not name.startswith("--") and name[:2] in options:
            flags = [f"-{c}" for c in name[1:]]
            if all(options.get(f, (None, None))[1] == 0 for f in flags):  # -np: -n -p
                args += [f for f in flags if options[f][0] not in _SELECTION]
                given |= {options[f][0] for f in flags}
                i += 1
                continue
            name, inline = name[:2], name[2:] or inline  # -c2: -c 2
        dest, nargs = options.get(name, (name.lstrip("-").replace("-", "_"), "?"))
        taken = [word]
        i += 1
        if not inline:
            if nargs is None:  # exactly one value
                if i < len(argv):
                    taken.append(argv[i])
                    i += 1
            elif nargs in ("*", "+", "?"):
                while i < len(argv) and not argv[i].startswith("-"):
                    taken.append(argv[i])
                    i += 1
                    if nargs == "?":
                        break
            elif isinstance(nargs, int):
                taken += argv[i:i + nargs]
                i += nargs
        given.add(dest)
        if dest not in _SELECTION:
            args += taken
    return {"program": snakemake_program(argv), "args": args, "targets": targets, "given": sorted(given)}


def is_job_step(argv: list[str]) -> bool:
    """Whether this Snakemake is one job's step (a SLURM job or a subprocess job), not the user's run."""
    return any(w.startswith(("--target-jobs", "--mode")) or w == "slurm-jobstep" for w in argv[1:])


def export_command(argv: list[str], options: dict | None = None) -> dict:
    """Put the user's command (`split_command`) into the environment the jobs inherit, and return it;
    a job step's own command line (a SLURM job parses the Snakefile again) leaves the user's in place."""
    if is_job_step(argv) and os.environ.get(COMMAND_ENV):
        return _command()
    command = split_command(argv, options)
    os.environ[COMMAND_ENV] = json.dumps(command)
    return command


def _command() -> dict:
    try:
        command = json.loads(os.environ.get(COMMAND_ENV, ""))
        if isinstance(command, dict) and {"program", "args", "targets"} <= set(command):
            return command
    except json.JSONDecodeError:
        pass
    return FALLBACK


def _join(program: str, words: list[str]) -> str:
    return " ".join([program, *map(shlex.quote, words)])


def _runnable(c: dict) -> list[str]:
    """The user's options, with `--cores all` when they gave no cores, jobs or profile: a command that
    only planned or built the report (`-n`, `--report`) would not run any job as printed."""
    if {"cores", "jobs", "profile", "workflow_profile"} & set(c.get("given", [])):
        return list(c["args"])
    return ["--cores", "all", *c["args"]]


def _then_targets(c: dict, flags: list[str], targets: list[str]) -> list[str]:
    """The user's options, the hint's `flags`, then `targets`: after a `--` where the user's command had one, or
    where no flag stands between the options and the targets (an option such as --configfile takes every word
    up to the next option). A flag after a `--` would be read as a target ("No rule to produce --unlock")."""
    dashes = ["--"] if targets and ("--" in c.get("given", []) or not flags) else []
    return [*_runnable(c), *flags, *dashes, *targets]


def again() -> str:
    """The user's command as they ran it (its targets included), to run once more."""
    c = _command()
    return _join(c["program"], _then_targets(c, [], c["targets"]))


def with_targets(*targets: str | Path, force: bool = False) -> str:
    """The user's command for these targets only (`force`: made again even if they exist)."""
    c = _command()
    return _join(c["program"], _then_targets(c, ["--force"] if force else [], list(map(str, targets))))


# what a job declares in a model folder it writes (rules/train.smk); its other files (the tokenizer's copy,
# growlm.json, the weights' .sha256, ...) are made by the same job but are not targets Snakemake knows
MODEL_OUTPUTS = ("model.safetensors", "config.json", "ledger.csv", "plan.json")


def rebuild_target(path: str | Path) -> str:
    """The declared output whose job makes `path`: the file itself, or for a file inside a grown
    model's folder (only `growth.json` is declared there) that folder's growth.json, and for a file of
    another model folder that its job did not declare (its tokenizer's copy, growlm.json) that folder's
    model.safetensors: `--force` of an undeclared file would fail (no rule makes it). A file of a cooldown
    branch's state (`<model>/branches/b<point>/state/`, growlm.envelope) is remade by the run it leaves:
    that model's model.safetensors."""
    path = Path(path)
    if "branches" in path.parts[:-1] and "state" in path.parts[path.parts.index("branches"):-1]:
        return str(Path(*path.parts[:path.parts.index("branches")]) / "model.safetensors")
    if "grown" in path.parts[:-1] and path.name != "growth.json":
        return str(path.parent / "growth.json")
    if "models" in path.parts[:-1] and path.name not in MODEL_OUTPUTS:
        return str(path.parent / "model.safetensors")
    return str(path)


def rebuild(*paths: str | Path) -> str:
    """One line that rebuilds `paths` and then continues the user's run:
    `<command> --force <targets> && <command as the user ran it>`."""
    targets = list(dict.fromkeys(rebuild_target(p) for p in paths))
    return f"{with_targets(*targets, force=True)} && {again()}"
