"""Entry script of rule evaluate_ensemble: the untrained logit-average ensemble of the members."""
import torch

from growlm.errors import job_log
from growlm.launch import job_devices
from growlm.jobs.evaluate import evaluate_ensemble

sm = snakemake  # noqa: F821 (injected by Snakemake)
with job_log(sm.log[0], sm.rule), job_devices(sm.resources, sm.rule):
    torch.set_num_threads(sm.threads)
    evaluate_ensemble(member_dirs=sm.params.members, test_files=dict(zip(sm.params.levels, sm.input.tests)),
                      context=sm.params.context, max_tokens=sm.params.max_tokens, out_file=sm.output[0])
