"""Entry script of rule compare: the comparison table and the loss curves."""
from growlm.evaluate import write_comparison
from growlm.jobs import job_log

sm = snakemake  # noqa: F821 (injected by Snakemake)
with job_log(sm.log[0], "compare"):
    write_comparison(sm.params.combos, sm.params.paths, comparison_csv=sm.output.comparison, curves_csv=sm.output.curves,
                     unigram_train=sm.input.unigram, unigram_test=sm.input.unigram_test,
                     vocab_size=sm.params.vocab_size, lr_sweep_csv=sm.output.lr_sweep)
