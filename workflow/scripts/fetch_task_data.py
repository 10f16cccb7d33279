"""Entry script of rule fetch_task_data: a benchmark task's data into the local cache (the prepare target)."""
import json
from pathlib import Path

from growlm.console import log
from growlm.errors import job_log
from growlm.harness import fetch_task_data

sm = snakemake  # noqa: F821 (injected by Snakemake)
with job_log(sm.log[0], sm.rule):
    record = fetch_task_data(sm.params.spec, log=log)
    Path(sm.output[0]).write_text(json.dumps(record, indent=2))
