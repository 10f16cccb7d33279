"""`TrainConfig`: every setting of one training run, typed, with one JSON round trip.

Torch-free, so that the workflow can build a job's settings while it parses the Snakefile and pass
them to the job as a rule parameter (Snakemake reruns a job exactly when they change). Everything
that serialises a training run's settings uses `to_dict` / `from_dict`: the rule parameters, the
torchrun entry point's `train.json`, the checkpoint fingerprint and the summary in `growlm.json`.

Two groups of fields:

* what is computed: the budget, batch, schedule, optimizer, evaluation and checkpoint cadence, the
  data seed and the refinement operators (`refiners`: {name: settings}, growlm.refiners);
* how the steps run (`HOW_FIELDS`): the device, the memory plan's micro-batch, activation
  recomputation and distribution strategy, `torch.compile`, how often the losses are read on the
  host, the MFU peak. A run resumed under
  another plan (after an out-of-memory error) is the same run, so these are left out of the
  checkpoint fingerprint (`run_settings`);
* what the job found on disk (`inputs`): the sha256 of every file the run reads (its token files,
  the tokenizer, carried moments, teachers...), set by the job. They are part of the checkpoint's
  identity (`growlm.checkpoint.run_identity`), so a checkpoint made with other data is never
  resumed, but not of the rule's params (`run_settings`): Snakemake tracks those files itself.

Defaults in one place. A field the config describes (`train.*`, and `model.context`) takes its default
from the config schema (`SCHEMA_DEFAULTS`, read from workflow/schemas/config.schema.yaml), and one the
schema requires of every stage (tokens, batch_size, lr, warmup_steps: config.yaml gives them) has none,
so a run built in code (a benchmark, a test, the compile check) says it, as a config does. A workflow
run takes none of them: `growlm.experiment.train_config` sets every field the config describes from
the validated config. The literal defaults left below are of what no config key describes (Adam's
betas, the cosine's full length, how and where the steps run, what the job sets).
tests/test_defaults.py checks both.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import MISSING, asdict, dataclass, fields, replace
from pathlib import Path

import yaml

from growlm.errors import GrowlmError

SCHEMA = Path(__file__).resolve().parents[2] / "schemas" / "config.schema.yaml"


def schema_defaults(schema_file: Path = SCHEMA) -> dict:
    """The defaults the config schema gives the settings of a training run: those of `train`'s shared
    keys, and `model.context` as `context`."""
    props = yaml.safe_load(schema_file.read_text())["properties"]
    out = {key: sub["default"] for key, sub in props["train"]["properties"].items()
           if isinstance(sub, dict) and "default" in sub}
    out["context"] = props["model"]["properties"]["context"]["default"]
    return out


SCHEMA_DEFAULTS = schema_defaults()

STRATEGIES = ("single", "ddp", "fsdp", "fsdp_offload")
# torch.compile's modes (`compile: true` is "default"); "reduce-overhead" captures the step in CUDA graphs
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
# train.compile of the user's run, as JSON, for the jobs that train outside a training rule's params (the
# V-cycle's stages in the grow job): how a job runs, passed through the environment the jobs inherit, so it
# never enters a rule's params (which would rerun jobs when it changes)
COMPILE_ENV = "GROWLM_TRAIN_COMPILE"


# where a compiling run's jobs keep torch.compile's caches (inductor's graphs and kernels, Triton's), under the
# working folder, unless TORCHINDUCTOR_CACHE_DIR says otherwise: torch's default, /tmp/torchinductor_$USER, is
# local to a node, so on a cluster every job would compile cold what the jobs before it compiled elsewhere
COMPILE_CACHE = Path(".snakemake") / "growlm" / "torchinductor"


def export_compile(setting, workdir: Path | None = None) -> None:
    """Put train.compile into the environment the workflow's jobs inherit (`COMPILE_ENV`), and, when it
    compiles, the compile cache they share (`COMPILE_CACHE` under `workdir`, the working folder, unless
    TORCHINDUCTOR_CACHE_DIR is set): a job reuses every kernel an earlier job compiled, on any node that
    sees the working folder. A cached kernel is the same code, so nothing computed changes."""
    os.environ[COMPILE_ENV] = json.dumps(setting)
    if setting and "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(((workdir or Path.cwd()) / COMPILE_CACHE).resolve())


def compile_from_env() -> bool | str:
    """train.compile as the workflow's run exported it (False outside the workflow)."""
    return json.loads(os.environ.get(COMPILE_ENV, "false"))


# the learning-rate schedules (`train.schedule`) and the shapes of a wsd decay (`train.wsd_shape`): each shape
# maps the decay's progress p in [0, 1] to the share of the way from the floor to the peak still left
SCHEDULES = ("cosine", "wsd")
DECAY_SHAPES = {"linear": lambda p: 1.0 - p, "cosine": lambda p: 0.5 * (1.0 + math.cos(math.pi * p)),
                "1-sqrt": lambda p: 1.0 - math.sqrt(p)}
WSD_FIELDS = ("wsd_decay", "wsd_shape")  # what only a wsd run reads
# in a wsd member's folder: its model where the decay began (growlm.runner.save_before_decay, members.source)
BEFORE_DECAY = "before_decay"

SYNC_EVERY_CUDA = 32  # sync_every 0 (automatic): read the losses every step on a CPU, every 32 steps on CUDA


@dataclass(kw_only=True)
class TrainConfig:
    tokens: int  # budget: training tokens for this job
    batch_size: int  # global batch, sequences per optimizer step (all processes together)
    context: int = SCHEMA_DEFAULTS["context"]  # tokens per sequence
    lr: float  # peak learning rate
    min_lr_ratio: float = SCHEMA_DEFAULTS["min_lr_ratio"]  # the decay ends at min_lr_ratio * lr
    decay_share: float = 1.0  # the decay reaches its floor after this share of the steps (LEMON's faster decay)
    warmup_steps: int  # linear warm-up
    schedule: str = SCHEMA_DEFAULTS["schedule"]  # cosine, or wsd: warm-up, stable at the peak, then a decay
    wsd_decay: float = SCHEMA_DEFAULTS["wsd_decay"]  # wsd: the share of the steps the decay takes, at the end
    wsd_shape: str = SCHEMA_DEFAULTS["wsd_shape"]  # wsd: the decay's shape (DECAY_SHAPES)
    weight_decay: float = SCHEMA_DEFAULTS["weight_decay"]
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = SCHEMA_DEFAULTS["grad_clip"]  # global gradient-norm clip (0: none)
    eval_interval: int = SCHEMA_DEFAULTS["eval_interval"]  # steps between held-out evaluations (ledger rows)
    eval_tokens: int = SCHEMA_DEFAULTS["eval_tokens"]  # validation tokens per evaluation
    final_eval_tokens: int = SCHEMA_DEFAULTS["final_eval_tokens"]  # ... of the run's last one (0: the whole split)
    checkpoint_every: int = SCHEMA_DEFAULTS["checkpoint_every"]  # steps between resumable checkpoints
    # log the training loss every step for this many steps (after growth; the workflow's members and M_0: 0)
    dense_log_steps: int = SCHEMA_DEFAULTS["dense_log_steps"]
    seed: int = 0  # data seed: batch k depends only on (seed, k)
    save_moments: str | None = None  # write the final AdamW moments here (members, for carry-over)
    # the refinement operators of the run (growlm.refiners: teach, freeze, carry, a plugin's), {name: settings}
    refiners: dict | None = None
    # how the steps run; not part of the run's identity
    device: str = "cpu"
    micro_batch_size: int | None = None  # gradient accumulation; None: the whole per-process batch
    recompute_every: int = 0  # activation recomputation on blocks 0, k, 2k, ... (1: all, 0: none)
    strategy: str = "single"  # single | ddp | fsdp | fsdp_offload (the memory plan's choice)
    compile: bool | str = SCHEMA_DEFAULTS["compile"]  # torch.compile the steps: False, True ("default") or a mode
    # with compile: also compile a grown model's masked form for its ramps (else they run eagerly: growlm.train)
    compile_ramps: bool = SCHEMA_DEFAULTS["compile_ramps"]
    sync_every: int = SCHEMA_DEFAULTS["sync_every"]  # read the losses on the host every k steps (0: sync_interval)
    peak_flops: float | None = None  # the device's dense bf16 peak for MFU; None: growlm.devices' table
    # what the job found on disk: {what: sha256} of the files the run reads (part of the checkpoint's identity)
    inputs: dict | None = None

    HOW_FIELDS = ("device", "micro_batch_size", "recompute_every", "strategy", "compile", "compile_ramps", "sync_every",
                  "peak_flops", "save_moments")

    @property
    def steps(self) -> int:
        return max(1, self.tokens // (self.batch_size * self.context))

    # -- the learning-rate schedule -------------------------------------------------------------
    @property
    def decay_end(self) -> int:
        """The step count at which the rate reaches its floor (held there after): the last step, or with
        `decay_share` < 1 that share of the steps."""
        return self._decay_end(self.steps)

    def _decay_end(self, steps: int) -> int:
        return steps if self.decay_share >= 1 else max(self.warmup_steps + 1, int(steps * self.decay_share))

    @property
    def decay_start(self) -> int | None:
        """wsd: the step count after which the decay begins (the last `wsd_decay` of the steps up to
        `decay_end`, at least one step); every step before it ran at the warm-up's or the peak rate. None
        under the cosine, which decays from the end of its warm-up on."""
        if self.schedule != "wsd":
            return None
        return self._decay_start(self.steps)

    def _decay_start(self, steps: int) -> int:
        end = self._decay_end(steps)
        return end - max(1, round(self.wsd_decay * end))

    # -- cooldown branches (wsd): shorter runs that share this run's steps up to a point -------------
    def branch_step(self, fraction: float) -> int:
        """The step count at `fraction` of this wsd run's stable phase (its steps before `decay_start`,
        the warm-up included), where a cooldown branch leaves it."""
        return int(round(fraction * self.decay_start))

    def branch(self, step: int, steps: int | None = None) -> "TrainConfig":
        """The settings of the complete wsd run that shares this run's first `step` steps and then decays:
        this run with a shorter budget, the one whose own decay begins after exactly `step` steps (the
        decay takes its `wsd_decay` share of the shorter run, with the same shape and floor). Every step
        before `step` has the same rate under both (warm-up, then the peak), so the branch continues this
        run's state at `step` - model, AdamW moments, the data position - with nothing else changed: the
        branch taken where this run's own decay begins is this run. Among the budgets whose decay begins at
        `step` (rounding makes one or two) the shortest is taken, unless `steps` names the other: the run of
        exactly a budget (M_0's branch at its budget under `baseline.extend`, growlm.branches). Raises
        GrowlmError for a step no wsd run of these settings decays from (inside the warm-up, or past this
        run's decay start), or a `steps` whose decay does not begin at `step`."""
        if self.schedule != "wsd":
            raise GrowlmError("cooldown branches need the wsd schedule (train.schedule: wsd)")
        if steps is not None:
            if not self.warmup_steps <= step <= self.decay_start or self._decay_start(int(steps)) != step:
                raise GrowlmError(f"a wsd run of {steps} steps does not decay from step {step} of this run")
            return self if int(steps) == self.steps else self.with_(tokens=int(steps) * self.batch_size * self.context)
        if step == self.decay_start:
            return self
        if not self.warmup_steps <= step < self.decay_start:
            raise GrowlmError(f"a cooldown branch must leave the run in its stable phase (steps {self.warmup_steps} "
                              f"to {self.decay_start}), not at step {step}")
        steps = step + 1
        while self._decay_start(steps) < step:
            steps += 1
        if self._decay_start(steps) != step:  # the decay start grows by 0 or 1 a step: never skips one
            raise GrowlmError(f"no wsd run of these settings decays from step {step}")
        return self.with_(tokens=steps * self.batch_size * self.context)

    def lr_at(self, step: int) -> float:
        """The rate of step `step` (from 0): linear warm-up over `warmup_steps`, then, under the cosine,
        cosine decay to `min_lr_ratio * lr` at `decay_end`; under wsd, the peak rate until
        `decay_start`, then the decay of shape `wsd_shape` to the same floor at `decay_end`. The
        cosine's arithmetic is the one growlm always used, so its runs are the same to the last bit."""
        if step < self.warmup_steps:
            return self.lr * (step + 1) / self.warmup_steps
        end, floor = self.decay_end, self.lr * self.min_lr_ratio
        if self.schedule == "wsd":
            start = self.decay_start
            if step < start:
                return self.lr
            return floor + (self.lr - floor) * DECAY_SHAPES[self.wsd_shape](min(1.0, (step - start) / (end - start)))
        progress = min(1.0, (step - self.warmup_steps) / max(1, end - self.warmup_steps))
        return floor + 0.5 * (self.lr - floor) * (1 + math.cos(math.pi * progress))

    def schedule_text(self) -> str:
        """The schedule in words, for the log and the report: 'cosine' or 'wsd (last 20%, 1-sqrt)'."""
        return f"wsd (last {self.wsd_decay:.0%}, {self.wsd_shape})" if self.schedule == "wsd" else self.schedule

    @property
    def compile_mode(self) -> str | None:
        """torch.compile's mode for the training steps, or None (eager)."""
        if self.compile is True:
            return "default"
        return self.compile or None

    @property
    def sync_interval(self) -> int:
        """Steps between two reads of the training losses on the host (growlm.train's sync points).

        A read waits for the device to finish every step queued so far. On a CPU there is no queue,
        so the automatic choice (sync_every 0) reads every step; on CUDA it reads every
        SYNC_EVERY_CUDA steps, so that the host can queue the next steps while the GPU runs."""
        if self.sync_every:
            return self.sync_every
        return SYNC_EVERY_CUDA if self.device.startswith("cuda") else 1

    # -- the one JSON round trip ----------------------------------------------------------------
    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict, **overrides) -> "TrainConfig":
        """From `to_dict`'s output (unknown keys are an error naming them); `overrides` win. Settings without
        `final_eval_tokens` (`run_settings` leaves it out where it is `eval_tokens`, and growlm wrote none before
        there was the key) end as their other evaluations do, on `eval_tokens`."""
        known = {f.name for f in fields(cls)}
        data = {**data, **overrides}
        if "final_eval_tokens" not in data and "eval_tokens" in data:
            data["final_eval_tokens"] = data["eval_tokens"]
        unknown = sorted(set(data) - known)
        if unknown:
            raise GrowlmError(f"unknown training settings {unknown}; known: {sorted(known)}")
        missing = [f.name for f in fields(cls) if f.name not in data and f.default is MISSING
                   and f.default_factory is MISSING]
        if missing:
            raise GrowlmError(f"training settings without {', '.join(missing)} (every config gives them: "
                              f"train.small and train.large)")
        return cls(**data)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str, **overrides) -> "TrainConfig":
        return cls.from_dict(json.loads(text), **overrides)

    def run_settings(self) -> dict:
        """The settings that make a run what it is (a rule's params; with `inputs`, the checkpoint's
        identity). A cosine run does not read the schedule's keys, so they are left out: its params and
        checkpoints are those of a run made before there was a choice of schedule, and a change of a
        wsd-only key reruns nothing that does not read it. So is `final_eval_tokens` where it is `eval_tokens`
        (a run's last evaluation like the others, as growlm evaluated before there was the key): an experiment
        finished before then keeps its models with `train.final_eval_tokens` set to `train.eval_tokens`."""
        skip = {*self.HOW_FIELDS, "inputs", *(("schedule", *WSD_FIELDS) if self.schedule == "cosine" else ()),
                *(("final_eval_tokens",) if self.final_eval_tokens == self.eval_tokens else ())}
        return {k: v for k, v in self.to_dict().items() if k not in skip}

    def with_(self, **changes) -> "TrainConfig":
        return replace(self, **changes)

    # -- checks ---------------------------------------------------------------------------------
    def validate(self, world: int = 1) -> None:
        """Raise GrowlmError naming the first setting that cannot work with `world` processes."""
        if self.tokens < self.batch_size * self.context:
            raise GrowlmError(f"token budget {self.tokens} is smaller than one batch "
                              f"({self.batch_size} x {self.context})")
        if self.lr <= 0:
            raise GrowlmError(f"learning rate must be positive, got {self.lr}")
        if not 0 < self.decay_share <= 1:
            raise GrowlmError(f"decay_share must be in (0, 1], got {self.decay_share}")
        problem = self.schedule_problem()
        if problem:
            raise GrowlmError(problem)
        if self.compile not in (True, False) and self.compile not in COMPILE_MODES:
            raise GrowlmError(f"unknown compile setting {self.compile!r}; true, false or one of {COMPILE_MODES}")
        if self.final_eval_tokens < 0:
            raise GrowlmError(f"final_eval_tokens must be 0 (the whole validation split) or a number of tokens, "
                              f"got {self.final_eval_tokens}")
        if self.sync_every < 0:
            raise GrowlmError(f"sync_every must be 0 (automatic) or a number of steps, got {self.sync_every}")
        if self.strategy not in STRATEGIES:
            raise GrowlmError(f"unknown strategy {self.strategy!r}; one of {STRATEGIES}")
        if self.batch_size % world:
            raise GrowlmError(f"batch_size {self.batch_size} is not divisible by the {world} processes")
        mb = self.micro_batch_size or self.batch_size // world
        if (self.batch_size // world) % mb:
            raise GrowlmError(f"micro_batch_size {mb} does not divide the per-process batch "
                              f"{self.batch_size // world}")

    def schedule_problem(self) -> str | None:
        """Why this run cannot take its schedule (None: it can), in words a config check can name a stage
        with (`growlm.validate`): an unknown schedule or shape, or a wsd decay that would begin inside the
        warm-up."""
        if self.schedule not in SCHEDULES:
            return f"unknown schedule {self.schedule!r}; one of {', '.join(SCHEDULES)}"
        if self.schedule != "wsd":
            return None
        if self.wsd_shape not in DECAY_SHAPES:
            return f"unknown wsd decay shape {self.wsd_shape!r}; one of {', '.join(DECAY_SHAPES)}"
        if not 0 < self.wsd_decay <= 1:
            return f"wsd_decay must be in (0, 1], got {self.wsd_decay}"
        if self.decay_start < self.warmup_steps:
            return (f"its wsd decay ({self.decay_end - self.decay_start} of {self.steps} steps) would begin at step "
                    f"{self.decay_start}, inside its warm-up of {self.warmup_steps} steps; a smaller wsd_decay, a "
                    f"shorter warm-up or a longer budget")
        return None
