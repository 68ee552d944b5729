# Sourced by the launch scripts: the Python that has neo_train. $PYTHON when set; else the
# active virtual environment's; else the repository's .venv (what ./install.sh makes); else python3.
_repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ -z "${PYTHON:-}" ]; then
  if [ -n "${VIRTUAL_ENV:-}" ] && [ -x "$VIRTUAL_ENV/bin/python" ]; then PYTHON="$VIRTUAL_ENV/bin/python"
  elif [ -x "$_repo/.venv/bin/python" ]; then PYTHON="$_repo/.venv/bin/python"
  else PYTHON=python3
  fi
fi
if ! "$PYTHON" -c 'import neo_train' 2>/dev/null; then
  echo "$(basename "$0"): error: $PYTHON cannot import neo_train; run ./install.sh or set PYTHON=/path/to/python" >&2
  exit 2
fi
# Each rank picks its intra-op threads itself (CPUs / local ranks, less the load; it prints the
# choice); this keeps torchrun from forcing and announcing OMP_NUM_THREADS=1.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
