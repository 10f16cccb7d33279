"""Entry script of rule evaluate_tasks: one lm-evaluation-harness task entry on one model."""
from pathlib import Path

import torch

from growlm.errors import job_log
from growlm.launch import job_devices
from growlm.jobs.evaluate import evaluate_tasks

sm = snakemake  # noqa: F821 (injected by Snakemake)
with job_log(sm.log[0], sm.rule), job_devices(sm.resources, sm.rule):
    torch.set_num_threads(sm.threads)
    evaluate_tasks(model_dir=Path(sm.input.model).parent, spec=sm.params.spec, limit=sm.params.limit,
                   out_file=sm.output[0])
