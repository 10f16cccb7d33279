"""The one byte-level BPE tokenizer every model of an experiment shares (Hugging Face `tokenizers`).

It is fitted on the training splits of all levels and saved so that
`transformers.AutoTokenizer.from_pretrained(dir)` loads it. Token id 0 is `<|endoftext|>`, which
separates sentences in the token streams and serves as BOS/EOS/PAD.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Iterator

from growlm.errors import GrowlmError

EOS = "<|endoftext|>"


def _lines(paths: Iterable[Path]) -> Iterator[str]:
    for path in paths:
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                line = line.rstrip("\n")
                if line:
                    yield line


def fit_tokenizer(train_files: list[str | Path], out_dir: str | Path, *, vocab_size: int,
                  min_frequency: int = 2, max_length: int = 1024):
    """Fit byte-level BPE on `train_files` (one sentence per line) and save it to `out_dir`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

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
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=EOS,
        eos_token=EOS,
        unk_token=EOS,
        pad_token=EOS,
        model_max_length=max_length,
    )
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(out_dir)
    return fast


def load_tokenizer(tokenizer_dir: str | Path):
    """The saved tokenizer, through `AutoTokenizer` as a user would load it."""
    from transformers import AutoTokenizer

    tokenizer_dir = Path(tokenizer_dir)
    if not (tokenizer_dir / "tokenizer.json").is_file():
        raise GrowlmError(f"no tokenizer at {tokenizer_dir} (tokenizer.json missing)")
    return AutoTokenizer.from_pretrained(tokenizer_dir)
