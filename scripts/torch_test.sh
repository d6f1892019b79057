#!/usr/bin/env bash
# The PyTorch backend (python/, issue 13) against a real torch: makes a virtual environment
# (${LOOM_TORCH_VENV:-build/torch-venv}) with torch ${LOOM_TORCH_VERSION:-2.15.0} from PyPI
# (its Linux wheels bring NVIDIA's CUDA libraries: about 4 GB, a few minutes), installs
# loom_torch there against the Loom that scripts/build.sh installed (${LOOM_PREFIX:-install}),
# and runs python/tests under torch's own multi-process harness.
#
#   scripts/torch_test.sh [pytest args]        e.g. -k ddp
#   scripts/torch_test.sh --prepare            only the virtual environment and torch
#                                              (scripts/test.sh runs this beside the build)
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
venv="${LOOM_TORCH_VENV:-$repo/build/torch-venv}"
prefix="${LOOM_PREFIX:-$repo/install}"
version="${LOOM_TORCH_VERSION:-2.15.0}"
prepare_only=0
if [[ "${1:-}" == --prepare ]]; then prepare_only=1; shift; fi
[[ $prepare_only == 1 || -f "$prefix/lib/libloom.so" ]] ||
  { echo "torch_test: no Loom in $prefix (scripts/build.sh first)" >&2; exit 1; }
if [[ ! -x "$venv/bin/python" ]] || ! "$venv/bin/python" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$version')" 2>/dev/null; then
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --upgrade pip setuptools wheel
  "$venv/bin/pip" install -q --no-compile "torch==$version" numpy expecttest pytest
fi
[[ $prepare_only == 1 ]] && { echo "torch_test: torch $version ready in $venv"; exit 0; }
MAX_JOBS="${LOOM_JOBS:-$(nproc)}" LOOM_PREFIX="$prefix" \
  "$venv/bin/pip" install -q --no-build-isolation --force-reinstall --no-deps "$repo/python"
# From the tests' folder: python/ itself would shadow the installed package.
cd "$repo/python/tests"
"$venv/bin/python" -c "import torch, loom_torch; print('torch_test: torch', torch.__version__, 'loom_torch on', loom_torch.library())"
"$venv/bin/python" -m pytest -q -p no:cacheprovider . "$@"
