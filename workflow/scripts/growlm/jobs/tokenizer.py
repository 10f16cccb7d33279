"""Jobs of the tokenizer stage: fit the shared BPE, encode one split. No torch."""

from __future__ import annotations

import shutil
from pathlib import Path

from growlm.console import log, warn
from growlm.pretrained import tokenizer_digest
from growlm.tokenizer import eos_of, fit_tokenizer as fit, load_tokenizer
from growlm.errors import GrowlmError, read_json
from growlm.tokens import concat_token_files, encode_file


def fit_tokenizer(train_files: list[str], out_dir: str | Path, *, vocab_size: int, min_frequency: int,
                  max_length: int) -> None:
    tok = fit(train_files, out_dir, vocab_size=vocab_size, min_frequency=min_frequency, max_length=max_length)
    got = tok.get_vocab_size(with_added_tokens=True)
    log(f"tokenizer: {got} tokens")
    if got < 0.9 * vocab_size:  # BPE ran out of pairs seen min_frequency times: the corpus is too small for it
        warn(f"tokenizer.vocab_size = {vocab_size}: the corpus gives only {got} tokens (no more pairs occur "
             f"{min_frequency} times, tokenizer.min_frequency); every model uses {got}. Ask for at most {got} to "
             f"say what you get, or give more text")


def member_tokenizer(member_dirs: list, out_dir: str | Path) -> None:
    """The pretrained members' tokenizer as the experiment's: they must all have the same one (its
    vocabulary, merges and special tokens; growlm.pretrained.tokenizer_digest), and it must have an
    end-of-text token (the corpus separates its units with it)."""
    digests = {str(d): tokenizer_digest({"kind": "path", "where": str(d)}) for d in member_dirs}
    first = next(iter(digests.values()))
    other = [d for d, h in digests.items() if h != first]
    if other:
        raise GrowlmError(f"the pretrained members' tokenizers differ ({member_dirs[0]} and {other[0]}); growlm "
                          f"encodes the corpus with one tokenizer for every model")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(Path(member_dirs[0]) / name, out_dir / name)
    tok = load_tokenizer(out_dir)
    log(f"tokenizer of the pretrained members ({member_dirs[0]}): {tok.get_vocab_size(with_added_tokens=True)} "
        f"tokens, end of text {eos_of(out_dir)}")


def encode_split(text_file: str | Path, tokenizer_dir: str | Path, out_file: str | Path, *, stats_file: str | Path,
                 split: str, caps: dict | None = None, threads: int | None = None) -> None:
    """Encode one split of a level; `caps` ({source: tokens}) trims the sources that set max_tokens."""
    lines = {name: spans[split] for name, spans in read_json(stats_file).get("lines", {}).items()}
    n = encode_file(text_file, load_tokenizer(tokenizer_dir), out_file, sources=lines, caps=caps or None,
                    threads=threads, eos=eos_of(tokenizer_dir))
    capped = f" ({', '.join(f'{k} capped at {v}' for k, v in caps.items())})" if caps else ""
    log(f"{text_file}: {n} tokens{capped}")


def mix_levels(token_files: list[str], out_file: str | Path) -> None:
    n = concat_token_files(token_files, out_file)
    log(f"{out_file}: {n} tokens from {', '.join(map(str, token_files))}")
