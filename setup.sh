#!/usr/bin/env bash
# Set up growlm in ./.venv: torch's CPU wheel first (a bare `torch` requirement would pull a
# multi-GB CUDA build), then the package with its pinned dependencies and the test tools.
# On a GPU machine, set TORCH_INDEX to a CUDA wheel index, e.g.
#   TORCH_INDEX=https://download.pytorch.org/whl/cu128 bash setup.sh
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
    if [ -n "${TORCH_INDEX:-}" ]; then
        .venv/bin/python -m pip install --quiet torch==2.13.0 --index-url "$TORCH_INDEX"
    else
        .venv/bin/python -m pip install --quiet torch==2.13.0
    fi
fi
.venv/bin/python -m pip install --quiet -e ".[test]"
.venv/bin/python -c "import growlm, torch, transformers, snakemake; print('growlm set up: torch', torch.__version__, '| transformers', transformers.__version__, '| snakemake', snakemake.__version__)"
