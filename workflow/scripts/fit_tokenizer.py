"""Entry script of rule fit_tokenizer."""
from pathlib import Path

from growlm.jobs import job_log
from growlm.tokenizer import fit_tokenizer

sm = snakemake  # noqa: F821 (injected by Snakemake)
with job_log(sm.log[0], "fit_tokenizer"):
    tok = fit_tokenizer(list(sm.input), Path(sm.output[0]).parent, vocab_size=sm.params.vocab_size,
                        min_frequency=sm.params.min_frequency, max_length=sm.params.max_length)
    print(f"tokenizer: {len(tok)} tokens")
