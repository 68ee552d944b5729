#!/usr/bin/env bash
# One node, N ranks (default: one per GPU, else 2 CPU ranks over gloo):
#   launch/single_node.sh --preset small --sharding row_wise
# equivalent to `neo-train train --nproc N ...`. Python: $PYTHON, the active venv, or ./.venv.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_python.sh"
NPROC=${NPROC:-$("$PYTHON" -c 'import torch; print(torch.cuda.device_count() or 2)')}
exec "$PYTHON" -m torch.distributed.run --standalone --nproc-per-node "$NPROC" -m neo_train train "$@"
