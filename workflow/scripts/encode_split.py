"""Entry script of rule encode_split."""
from pathlib import Path

from growlm.data import encode_file
from growlm.jobs import job_log
from growlm.tokenizer import load_tokenizer

sm = snakemake  # noqa: F821 (injected by Snakemake)
with job_log(sm.log[0], "encode_split"):
    n = encode_file(sm.input.text, load_tokenizer(Path(sm.input.tokenizer).parent), sm.output[0])
    print(f"{sm.input.text}: {n} tokens")
