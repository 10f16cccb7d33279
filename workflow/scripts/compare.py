"""Entry script of rule compare: the comparison table, the loss curves and the learning-rate sweep."""
from growlm.errors import job_log
from growlm.jobs.compare import compare

sm = snakemake  # noqa: F821 (injected by Snakemake)
with job_log(sm.log[0], sm.rule):
    compare(combos=sm.params.combos, paths=sm.params.paths, vocab_size=sm.params.vocab_size,
            unigram_train=sm.input.unigram, unigram_test=sm.input.unigram_test, comparison_csv=sm.output.comparison,
            curves_csv=sm.output.curves, lr_sweep_csv=sm.output.lr_sweep, levels=sm.params.levels,
            task_files=sm.input.tasks, pretrained=sm.params.get("pretrained"), branches=sm.params.branches,
            savings_csv=sm.output.savings, token_files={"large": sm.input.large_train, "members": sm.input.members_train})
