"""The shared tokenizer (AutoTokenizer-loadable) and the token files / batches."""

import numpy as np
import pytest
import torch

from growlm.data import BatchSampler, eval_batches
from growlm.errors import GrowlmError
from growlm.tokenizer import EOS, fit_tokenizer, load_tokenizer, vocab_size
from growlm.tokens import encode_file, load_tokens, shard

SENTENCES = [
    "The cat sat on the mat.", "See the dog run!", "Can the hen catch the rat?",
    "Ann has a red hat and a big fan.", "The little red hen found a grain of wheat.",
] * 40


@pytest.fixture
def corpus(tmp_path):
    f = tmp_path / "train.txt"
    f.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    return f


def test_tokenizer_round_trips_through_autotokenizer(tmp_path, corpus):
    from transformers import AutoTokenizer

    fit_tokenizer([corpus], tmp_path / "tok", vocab_size=300)
    tok = AutoTokenizer.from_pretrained(tmp_path / "tok")
    assert len(tok) <= 300 and tok.eos_token == "<|endoftext|>" and tok.eos_token_id == 0
    assert len(tok) == vocab_size(tmp_path / "tok")
    ids = tok("The little red hen.")["input_ids"]
    assert tok.decode(ids).strip() == "The little red hen."
    assert len(ids) < len("The little red hen.")  # merges were learned
    # the token files are written with `tokenizers` alone: the same ids as transformers gives
    assert load_tokenizer(tmp_path / "tok").encode("The little red hen.", add_special_tokens=False).ids == ids


def test_encode_file_puts_eos_after_every_sentence(tmp_path, corpus):
    fit_tokenizer([corpus], tmp_path / "tok", vocab_size=300)
    tok = load_tokenizer(tmp_path / "tok")
    n = encode_file(corpus, tok, tmp_path / "train.npy")
    arr = load_tokens(tmp_path / "train.npy")
    assert arr.dtype == np.uint16 and arr.size == n
    assert int((arr == tok.token_to_id(EOS)).sum()) == len(SENTENCES)


def test_batches_depend_only_on_seed_and_step():
    toks = np.arange(5000, dtype=np.uint16)
    a = BatchSampler(toks, batch_size=4, context=8, seed=3)
    b = BatchSampler(toks, batch_size=4, context=8, seed=3)
    x1, y1 = a.batch(7)
    a.batch(8)
    x2, y2 = b.batch(7)
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    assert torch.equal(x1[:, 1:], y1[:, :-1])  # targets are inputs shifted by one
    assert not torch.equal(a.batch(9)[0], x1)


def test_eval_batches_cover_disjoint_windows():
    toks = np.arange(1000, dtype=np.uint16)
    xs = torch.cat([x for x, _ in eval_batches(toks, batch_size=4, context=10, max_tokens=200)])
    assert xs.shape == (20, 10)
    assert len(set(xs[:, 0].tolist())) == 20


def test_shards_are_disjoint():
    toks = np.arange(100, dtype=np.uint16)
    parts = [set(shard(toks, i, 4).tolist()) for i in range(4)]
    assert all(len(p) == 25 for p in parts) and not set.intersection(*parts[:2])


def test_missing_and_corrupt_token_files_are_named(tmp_path):
    with pytest.raises(GrowlmError, match="does not exist"):
        load_tokens(tmp_path / "nope.npy")
    bad = tmp_path / "bad.npy"
    bad.write_bytes(b"not numpy")
    with pytest.raises(GrowlmError, match="bad.npy"):
        load_tokens(bad)
    with pytest.raises(GrowlmError, match="no tokenizer"):
        load_tokenizer(tmp_path)
