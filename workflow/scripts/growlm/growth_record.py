"""`growth.json`: what a grow job made, as one typed record (`Growth`), written in one place and read
through it everywhere.

Every grow job - an operator or chain (`growlm.jobs.grow.grow`) or a schedule
(`growlm.jobs.grow.grow_schedule`) - leaves the grown model and this record beside it. Its readers
are the refine job (the cost its live curves start at; what the refiners find: the members as
teachers, the files the grow job left for their needs), the comparison (what M'_1 cost before its
refinement: the members it used, their trunk, the growth's FLOPs and wall time) and the integrity
check (`growlm.outputs.damaged_files`, which only parses it). It is torch-free and low in the layers
so that all of them read the same fields with the same defaults, instead of each one its own `.get`
of an untyped dict.

The file keeps the keys it always had (a grown folder made by an older growlm reads the same): the
refiners' needs (`provided`) stand at its top level under the names the grow job's providers give
them (`moments`, `moments_step`, `inherited`); `stages` only for a schedule, `plugins` only when the
method's operators came from plugin files.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from pathlib import Path

from growlm.errors import GrowlmError, read_json

GROWTH_FILE = "growth.json"


@dataclass
class Growth:
    """One grow job's record. `members`: the members it used, each {dir, flops, wall_s[, pretrained][, role:
    "trunk"]} (the members' shared trunk last, counted once); `growth_flops`/`growth_wall_s`: the
    growth's own cost (a schedule's: all its training; wall time without compilation); `stages`: a
    schedule's stages; `provided`: what the grow job wrote for the refiners' needs (file names relative
    to the grown folder, and what goes with them), by the names its providers give; `plugins`: the
    plugin files of the method's operators, which the refine job loads for their refiners."""

    method: str = ""
    chain: list = field(default_factory=list)
    options: dict = field(default_factory=dict)
    growth_flops: int | float = 0
    growth_wall_s: float = 0.0
    members: list = field(default_factory=list)
    stages: list | None = None
    provided: dict = field(default_factory=dict)
    plugins: list = field(default_factory=list)

    def to_dict(self) -> dict:
        """The JSON form: the core fields, `stages` for a schedule, the provided entries at the top level,
        `plugins` when there are any."""
        out = {"method": self.method, "chain": list(self.chain), "options": self.options,
               "growth_flops": self.growth_flops, "growth_wall_s": self.growth_wall_s, "members": self.members}
        if self.stages is not None:
            out["stages"] = self.stages
        clash = sorted(set(self.provided) & {f.name for f in fields(self)})
        if clash:  # a provider's entry must not shadow a field: the record would read back differently
            raise GrowlmError(f"growth record: provided entries {clash} have the names of its own fields")
        out.update(self.provided)
        if self.plugins:
            out["plugins"] = [str(p) for p in self.plugins]
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def write(self, out_dir) -> Path:
        """Write the record into the grown folder `out_dir` (the grow job's declared output)."""
        path = Path(out_dir) / GROWTH_FILE
        path.write_text(self.to_json())
        return path

    @classmethod
    def from_dict(cls, data: dict) -> "Growth":
        """A record from its JSON form; a key that is no field is a provided entry."""
        known = {f.name for f in fields(cls)} - {"provided"}
        kw = {k: v for k, v in data.items() if k in known}
        return cls(**kw, provided={k: v for k, v in data.items() if k not in known})

    @classmethod
    def read(cls, where) -> "Growth":
        """The record of a grown folder (or of the growth.json given); a damaged file raises the user
        error that names it and the command that rebuilds it (`growlm.errors.read_json`)."""
        path = Path(where)
        return cls.from_dict(read_json(path if path.suffix == ".json" else path / GROWTH_FILE))
