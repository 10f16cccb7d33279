"""Entry script of rule evaluate_model."""
from pathlib import Path

import torch

from growlm.errors import job_log
from growlm.launch import job_devices
from growlm.jobs.evaluate import evaluate_model

sm = snakemake  # noqa: F821 (injected by Snakemake)
with job_log(sm.log[0], sm.rule), job_devices(sm.resources, sm.rule):
    torch.set_num_threads(sm.threads)
    evaluate_model(model_dir=Path(sm.input.model).parent, test_files=dict(zip(sm.params.levels, sm.input.tests)),
                   context=sm.params.context, max_tokens=sm.params.max_tokens, out_file=sm.output[0])
