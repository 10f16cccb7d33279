#!/usr/bin/env bash
# Set up growlm in ./.venv: torch first, the build this machine can use (a bare `torch` requirement
# would pull whatever build the index serves), then the package with its pinned dependencies, the
# test tools and the eval extra (lm-evaluation-harness for evaluate.tasks, tensorboard for
# train.log_to).
#
# Which torch (say it without installing anything: `bash setup.sh --which-torch`):
#   - TORCH_INDEX set: torch from that wheel index, as given, e.g.
#       TORCH_INDEX=https://download.pytorch.org/whl/cu128 bash setup.sh
#   - an NVIDIA driver (`nvidia-smi` runs and reports "CUDA Version: X.Y"): the CUDA build of the
#     newest CUDA in TORCH_CUDA_BUILDS not above X.Y (a build for a newer CUDA than the driver's
#     would not run); a driver older than all of them gets the CPU build, and says so;
#   - no NVIDIA driver: the CPU build, torch==VERSION+cpu from pip's own configured index (or
#     find-links) where it offers it, else PyTorch's CPU index; if that is out of reach, torch from
#     pip's configured index as it comes.
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3}
TORCH_VERSION=2.13.0
# PyTorch's CUDA builds of TORCH_VERSION, newest first, as "CUDA version:index suffix" (see the
# install matrix on pytorch.org when TORCH_VERSION changes)
TORCH_CUDA_BUILDS="13.0:cu130 12.8:cu128 12.6:cu126"
WHEELS=https://download.pytorch.org/whl

# the CUDA version the NVIDIA driver supports ("12.8"), empty without nvidia-smi or a working driver
driver_cuda() {
    command -v nvidia-smi >/dev/null 2>&1 || return 0
    { nvidia-smi 2>/dev/null || true; } | sed -n 's/.*CUDA Version: *\([0-9][0-9]*\.[0-9][0-9]*\).*/\1/p' | sed -n 1p
}

# is version $1 <= version $2 (major.minor)?
version_le() {
    local a_major=${1%%.*} a_minor=${1#*.} b_major=${2%%.*} b_minor=${2#*.}
    [ "$a_major" -lt "$b_major" ] || { [ "$a_major" -eq "$b_major" ] && [ "$a_minor" -le "$b_minor" ]; }
}

# sets TORCH_FROM (an index URL, or "cpu") and TORCH_WHY
choose_torch() {
    if [ -n "${TORCH_INDEX:-}" ]; then
        TORCH_FROM=$TORCH_INDEX TORCH_WHY="TORCH_INDEX is set"
        return
    fi
    local cuda build
    cuda=$(driver_cuda)
    if [ -z "$cuda" ]; then
        TORCH_FROM=cpu
        if command -v nvidia-smi >/dev/null 2>&1; then
            TORCH_WHY="nvidia-smi reports no CUDA version (no working NVIDIA driver)"
        else
            TORCH_WHY="no NVIDIA driver (nvidia-smi not found)"
        fi
        return
    fi
    for build in $TORCH_CUDA_BUILDS; do
        if version_le "${build%%:*}" "$cuda"; then
            TORCH_FROM=$WHEELS/${build##*:}
            TORCH_WHY="the NVIDIA driver supports CUDA $cuda; ${build##*:} is the newest CUDA build of torch $TORCH_VERSION not above it"
            return
        fi
    done
    TORCH_FROM=cpu
    TORCH_WHY="the NVIDIA driver supports CUDA $cuda only, older than every CUDA build of torch $TORCH_VERSION ($TORCH_CUDA_BUILDS); update the driver for the GPU, or set TORCH_INDEX"
}

choose_torch
if [ "$TORCH_FROM" = cpu ]; then
    TORCH_SAYS="torch $TORCH_VERSION, CPU build ($TORCH_VERSION+cpu from pip's configured index, else $WHEELS/cpu)"
else
    TORCH_SAYS="torch $TORCH_VERSION from $TORCH_FROM"
fi
if [ "${1:-}" = "--which-torch" ]; then
    echo "$TORCH_SAYS: $TORCH_WHY"
    exit 0
fi

if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
    echo "setup.sh: $TORCH_SAYS: $TORCH_WHY"
    if [ "$TORCH_FROM" != cpu ]; then
        .venv/bin/python -m pip install --quiet "torch==$TORCH_VERSION" --index-url "$TORCH_FROM" || {
            echo "setup.sh: torch $TORCH_VERSION did not install from $TORCH_FROM; set TORCH_INDEX to a wheel index" \
                 "that has it (e.g. $WHEELS/cpu for the CPU build)" >&2
            exit 1
        }
    elif ! .venv/bin/python -m pip install --quiet "torch==$TORCH_VERSION+cpu" 2>/dev/null \
         && ! .venv/bin/python -m pip install --quiet "torch==$TORCH_VERSION" --index-url "$WHEELS/cpu"; then
        echo "setup.sh: no CPU build of torch $TORCH_VERSION within reach; torch $TORCH_VERSION from pip's configured index" >&2
        .venv/bin/python -m pip install --quiet "torch==$TORCH_VERSION"
    fi
fi
.venv/bin/python -m pip install --quiet -e ".[test,eval]"
.venv/bin/python -c "import growlm, torch, transformers, snakemake; print('growlm set up: torch', torch.__version__, '| CUDA', torch.version.cuda or 'none', '| transformers', transformers.__version__, '| snakemake', snakemake.__version__)"
