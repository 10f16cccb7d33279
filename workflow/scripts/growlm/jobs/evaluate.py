"""Jobs of the evaluation stage: held-out metrics of a model, of the members' ensemble, and the
comparison of M_0 with every M_1 (`growlm.compare`)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from growlm.compare import write_comparison
from growlm.devices import choose_device
from growlm.jobs.common import log
from growlm.loss import evaluate
from growlm.model import LogitEnsemble, load_model
from growlm.tokens import load_tokens


def _evaluate(model: torch.nn.Module, name: str, test_files: dict, context: int, max_tokens: int, out_file) -> dict:
    device = choose_device()
    model = model.to(device)
    result = {"model": name, "levels": {}}
    for level, f in sorted(test_files.items()):
        result["levels"][str(level)] = evaluate(model, load_tokens(f), context=context, batch_size=16,
                                                max_tokens=max_tokens, device=device)
    Path(out_file).parent.mkdir(parents=True, exist_ok=True)
    Path(out_file).write_text(json.dumps(result, indent=2))
    log(f"evaluated {name}: {json.dumps(result['levels'])}")
    return result


def evaluate_model(*, model_dir, test_files: dict, context: int, max_tokens: int, out_file) -> dict:
    """Held-out loss, perplexity and next-token accuracy on each level's test split."""
    return _evaluate(load_model(model_dir), str(model_dir), test_files, context, max_tokens, out_file)


def evaluate_ensemble(*, member_dirs: list[str], test_files: dict, context: int, max_tokens: int, out_file) -> dict:
    """The same metrics for the untrained logit-average ensemble of the members."""
    ensemble = LogitEnsemble([load_model(d) for d in member_dirs])
    return _evaluate(ensemble, f"ensemble of {len(member_dirs)}", test_files, context, max_tokens, out_file)


def compare(*, combos: list[dict], paths: dict, vocab_size: int, unigram_train, unigram_test, comparison_csv,
            curves_csv, lr_sweep_csv, levels: dict | None = None) -> None:
    """The comparison table, every model's curve, and the learning-rate sweep (growlm.compare)."""
    write_comparison(combos, paths, comparison_csv=comparison_csv, curves_csv=curves_csv, unigram_train=unigram_train,
                     unigram_test=unigram_test, vocab_size=vocab_size, lr_sweep_csv=lr_sweep_csv,
                     levels=levels)
