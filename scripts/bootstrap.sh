#!/usr/bin/env bash
# Creates .venv and installs gradient-doctor (editable) with its dev tools.
# TORCH_SPEC picks the torch requirement (default: "torch"; CI sets torch==2.13.0, the CPU
# build on local disk). A torch that already imports inside the venv is never reinstalled.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
VPY=.venv/bin/python
if ! "$VPY" -c 'import torch, sys; v = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2]); sys.exit(0 if v >= (2, 4) else 1)' 2>/dev/null; then
  echo "bootstrap: installing $TORCH_SPEC" >&2
  "$VPY" -m pip install -q --disable-pip-version-check "$TORCH_SPEC"
fi
stamp=.venv/.gradient-doctor-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "bootstrap: installing gradient-doctor and dev tools" >&2
  "$VPY" -m pip install -q --disable-pip-version-check -e '.[dev]'
  touch "$stamp"
fi
