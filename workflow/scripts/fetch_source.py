"""Entry script of rules fetch_source and download_source."""
from growlm.jobs import fetch_source, job_log

with job_log(snakemake.log[0], snakemake.rule):  # noqa: F821 (snakemake is injected)
    src = snakemake.params.source  # noqa: F821
    bundled = snakemake.input[0] if snakemake.rule == "fetch_source" else None  # noqa: F821
    fetch_source(src, snakemake.output[0], bundled=bundled)  # noqa: F821
