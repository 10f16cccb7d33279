"""The one byte-level BPE tokenizer every model of an experiment shares (Hugging Face `tokenizers`).

It is fitted on the training splits of all levels and saved as `tokenizer.json` plus a
`tokenizer_config.json`, so that `transformers.AutoTokenizer.from_pretrained(dir)` loads it (every
saved model folder gets a copy). Token id 0 is `<|endoftext|>`, which separates sentences in the
token streams and serves as BOS/EOS/PAD. Only `tokenizers` is used here (no transformers, no torch):
the tokenizer jobs start in a fraction of a second.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Iterable, Iterator

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from growlm.errors import GrowlmError, damaged

EOS = "<|endoftext|>"
FILES = ("tokenizer.json", "tokenizer_config.json")


def _lines(paths: Iterable[Path]) -> Iterator[str]:
    for path in paths:
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                line = line.rstrip("\n")
                if line:
                    yield line


def fit_tokenizer(train_files: list[str | Path], out_dir: str | Path, *, vocab_size: int,
                  min_frequency: int = 2, max_length: int = 1024) -> Tokenizer:
    """Fit byte-level BPE on `train_files` (one sentence per line) and save it to `out_dir`."""
    paths = [Path(p) for p in train_files]
    for p in paths:
        if not p.is_file():
            raise GrowlmError(f"tokenizer input {p} does not exist")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_lines(paths), trainer=trainer)
    # what transformers' PreTrainedTokenizerFast sets: no special tokens added around a sequence
    tok.post_processor = processors.TemplateProcessing(single="$A:0", pair="$A:0 $B:1", special_tokens=[])
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_dir / "tokenizer.json"))
    config = {"backend": "tokenizers", "bos_token": EOS, "eos_token": EOS, "model_max_length": max_length,
              "pad_token": EOS, "tokenizer_class": "TokenizersBackend", "unk_token": EOS}
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return tok


def load_tokenizer(tokenizer_dir: str | Path) -> Tokenizer:
    """The saved tokenizer (`tokenizers.Tokenizer`; `AutoTokenizer` loads the same folder)."""
    path = Path(tokenizer_dir) / "tokenizer.json"
    if not path.is_file():
        raise GrowlmError(f"no tokenizer at {tokenizer_dir} (tokenizer.json missing)")
    try:
        return Tokenizer.from_file(str(path))
    except Exception as err:  # a truncated or corrupt file
        raise damaged(path, f"not a readable tokenizer: {err}") from None


def vocab_size(tokenizer_dir: str | Path) -> int:
    """The vocabulary size of the saved tokenizer, special tokens included (every model's V)."""
    return load_tokenizer(tokenizer_dir).get_vocab_size(with_added_tokens=True)


def eos_id(tokenizer: Tokenizer) -> int:
    return tokenizer.token_to_id(EOS)


def eos_of(tokenizer_dir: str | Path) -> int:
    """The id of the tokenizer's end-of-text token: growlm's own `<|endoftext|>`, or the one a pretrained
    tokenizer names in its tokenizer_config.json (`eos_token`: `</s>`, `<|endoftext|>`, ...)."""
    tok = load_tokenizer(tokenizer_dir)
    config = Path(tokenizer_dir) / "tokenizer_config.json"
    name = EOS
    if config.is_file():
        try:
            named = json.loads(config.read_text()).get("eos_token")
        except json.JSONDecodeError as err:
            raise damaged(config, f"not valid JSON: {err}") from None
        name = named.get("content") if isinstance(named, dict) else (named or EOS)
    found = tok.token_to_id(name)
    if found is None:
        raise GrowlmError(f"the tokenizer in {tokenizer_dir} has no end-of-text token ({name!r}); growlm separates "
                          f"the corpus's units with it")
    return found


def copy_tokenizer(tokenizer_dir: str | Path, out_dir: str | Path) -> None:
    """Copy the tokenizer's files into a model folder."""
    for name in FILES:
        shutil.copy(Path(tokenizer_dir) / name, Path(out_dir) / name)
