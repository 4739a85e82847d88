#!/usr/bin/env bash
# tools/torch-venv.sh [VENV]: makes sure VENV (default $TORCH_VENV, else
# ~/.cache/kiln/torch-venv) is a Python venv with torch and torchvision, for
# `make bench-torch`, and the packages TORCH_VENV_EXTRA names (space-separated, each
# imported under its own name: `make parity-transformers` asks for "transformers
# safetensors"). An existing venv that imports them all is used as it is; otherwise the
# venv is created and pip installs them from PyPI (TORCH_INDEX_URL picks another index,
# e.g. https://download.pytorch.org/whl/cpu for the smaller CPU-only wheels). Kept outside
# the build folder, so `make clean` does not cost a download. Prints the venv's python.
set -u -o pipefail

VENV=${1:-${TORCH_VENV:-$HOME/.cache/kiln/torch-venv}}
PY=$VENV/bin/python
read -r -a PACKAGES <<< "torch torchvision ${TORCH_VENV_EXTRA:-}"
IMPORTS=$(IFS=,; echo "${PACKAGES[*]}")
NAMES="${PACKAGES[*]}"

if "$PY" -c "import $IMPORTS" 2>/dev/null; then
  echo "$PY"
  exit 0
fi

echo "kiln: installing $NAMES into $VENV (once; a few GiB from PyPI)" >&2
if [ ! -x "$PY" ]; then
  python3 -m venv "$VENV" >&2 || {
    echo "kiln: cannot create a venv at $VENV: python3 -m venv failed (Debian: apt-get install python3-venv)" >&2
    exit 1
  }
fi
index=()
[ -n "${TORCH_INDEX_URL:-}" ] && index=(--index-url "$TORCH_INDEX_URL")
"$PY" -m pip install --disable-pip-version-check "${index[@]}" "${PACKAGES[@]}" >&2 || {
  echo "kiln: pip could not install $NAMES into $VENV (no network, or no wheel for" \
       "this Python and platform?); point TORCH_VENV at a venv that has them" >&2
  exit 1
}
"$PY" -c "import $IMPORTS" >&2 || {
  echo "kiln: $NAMES were installed into $VENV but do not import (above)" >&2
  exit 1
}
echo "$PY"
