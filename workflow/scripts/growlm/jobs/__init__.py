"""What one workflow job does: one module per stage, mirroring `workflow/rules/<stage>.smk`.

    corpus      download_source, prepare_source, build_level
    tokenizer   fit_tokenizer, encode_split
    train       train_model (the members, M_0), refine
    grow        grow, grow_schedule
    evaluate    evaluate_model, evaluate_ensemble, compare
    profile     profile

Each job function takes plain values (paths and the settings its rule declares as `params`, which
`growlm.experiment` resolves from the config), reads its inputs, calls the library and writes its
outputs; the entry scripts in `workflow/scripts/` call them with values from the `snakemake` object,
and a notebook can call them directly. The corpus and tokenizer jobs import no torch.
"""
