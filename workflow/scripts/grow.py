"""Entry script of rule grow: the members -> M'_1 (or, for the V-cycle, M_0's coalesced init -> M'_1)."""
from pathlib import Path

import torch

from growlm.experiment import method_chain
from growlm.jobs import apollo, grow, growth_options, job_log, vcycle
from growlm.tokenizer import load_tokenizer

sm = snakemake  # noqa: F821 (injected by Snakemake)
with job_log(sm.log[0], "grow"):
    torch.set_num_threads(sm.threads)
    out_dir = Path(sm.output[0]).parent
    if sm.wildcards.method == "vcycle":
        vocab = len(load_tokenizer(Path(sm.input.tokenizer).parent))
        vcycle(config=sm.config, n_embd=int(sm.wildcards.d1), n_layer=int(sm.wildcards.L1),
               seed=int(sm.wildcards.seed), train_file=sm.input.data, val_file=sm.input.val, vocab_size=vocab,
               out_dir=out_dir)
    elif sm.wildcards.method == "apollo":
        vocab = len(load_tokenizer(Path(sm.input.tokenizer).parent))
        apollo(config=sm.config, n_embd=int(sm.wildcards.d1), n_layer=int(sm.wildcards.L1),
               seed=int(sm.wildcards.seed), train_file=sm.input.data, vocab_size=vocab, out_dir=out_dir)
    else:
        options = growth_options(method_chain(sm.wildcards.method), dict(sm.params.options),
                                 refine_steps=sm.params.refine_steps, data_file=sm.input.data,
                                 batch_size=sm.params.batch_size, context=sm.params.context,
                                 seed=int(sm.wildcards.seed))
        grow(member_dirs=sm.params.members, method=sm.wildcards.method, n_embd=int(sm.wildcards.d1),
             n_layer=int(sm.wildcards.L1), seed=int(sm.wildcards.seed), options=options, out_dir=out_dir,
             optimizer_state=sm.params.optimizer_state)
