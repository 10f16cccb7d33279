"""Jobs of the tokenizer stage: fit the shared BPE, encode one split. No torch."""

from __future__ import annotations

from pathlib import Path

from growlm.jobs.common import log
from growlm.tokenizer import fit_tokenizer as fit, load_tokenizer
from growlm.tokens import encode_file


def fit_tokenizer(train_files: list[str], out_dir: str | Path, *, vocab_size: int, min_frequency: int,
                  max_length: int) -> None:
    tok = fit(train_files, out_dir, vocab_size=vocab_size, min_frequency=min_frequency, max_length=max_length)
    log(f"tokenizer: {tok.get_vocab_size(with_added_tokens=True)} tokens")


def encode_split(text_file: str | Path, tokenizer_dir: str | Path, out_file: str | Path) -> None:
    n = encode_file(text_file, load_tokenizer(tokenizer_dir), out_file)
    log(f"{text_file}: {n} tokens")
