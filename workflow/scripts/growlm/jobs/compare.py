"""The job of rule compare: M_0 beside every M_1, from the files the other jobs wrote (`growlm.compare`).

Apart from `growlm.jobs.evaluate` because it needs neither torch nor transformers: importing them is most of
an evaluation job's start (about 3 CPU seconds), and the comparison reads only CSV and JSON files."""

from __future__ import annotations

from growlm.compare import write_comparison


def compare(*, combos: list[dict], paths: dict, vocab_size: int, unigram_train, unigram_test, comparison_csv,
            curves_csv, lr_sweep_csv, levels: dict | None = None, task_files: list | None = None,
            pretrained: dict | None = None, branches: dict | None = None, savings_csv=None,
            token_files: dict | None = None) -> None:
    """The comparison table, every model's curve, the learning-rate sweep and the saving at each loss
    (growlm.compare); `task_files`: the models' scores on lm-evaluation-harness tasks, as columns beside the
    rest; `pretrained`: the members brought and their stated cost (growlm.compare.priced); `branches`: the
    points of the cooldown branches of M_0 ("baseline") and of the refinements ("refine"); `token_files`: the
    large arms' and the members' training tokens, whose passes the comparison states."""
    write_comparison(combos, paths, comparison_csv=comparison_csv, curves_csv=curves_csv, unigram_train=unigram_train,
                     unigram_test=unigram_test, vocab_size=vocab_size, lr_sweep_csv=lr_sweep_csv,
                     levels=levels, task_files=task_files, pretrained=pretrained, branches=branches,
                     savings_csv=savings_csv, token_files=token_files)
