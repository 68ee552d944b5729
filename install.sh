#!/usr/bin/env bash
# Install neo_train into a virtual environment (default ./.venv) from the project's own files.
#
#   ./install.sh            runtime (CPU): torch==2.13.0, fbgemm-gpu-cpu==1.8.0, torchrec 1.8 (--no-deps), ...
#   ./install.sh --dev      + test tools (pytest)
#   ./install.sh --triton   + triton==3.7.1 (690 MB; CPU runs it only under TRITON_INTERPRET=1)
#   VENV=/path ./install.sh    another venv location; PYTHON=python3.11 picks the interpreter
#
# Every pip call carries requirements/constraints.txt, so nothing can swap the CPU torch for a
# multi-GB CUDA build. torchrec is installed with --no-deps: its metadata asks for the CUDA
# fbgemm-gpu, which would overwrite fbgemm-gpu-cpu (so `pip check` always complains about it).
# GPU machines: see README, "Install on a GPU machine".
set -euo pipefail
cd "$(dirname "$0")"
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
extras=()
for arg in "$@"; do
  case "$arg" in
    --dev) extras+=(-r requirements/dev.txt) ;;
    --triton) extras+=(triton==3.7.1) ;;
    *) echo "install.sh: unknown option $arg" >&2; exit 2 ;;
  esac
done
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
pip=("$VENV/bin/python" -m pip install --disable-pip-version-check -q -c requirements/constraints.txt)
"${pip[@]}" -r requirements/cpu.txt "${extras[@]}"
"${pip[@]}" --no-deps torchrec==1.8.0
"${pip[@]}" --no-deps --no-build-isolation -e .
"$VENV/bin/python" -c "import neo_train.kernels as k; print('neo_train installed;', k.backend_report())"
