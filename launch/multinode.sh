#!/usr/bin/env bash
# Multi-node neo_train with torchrun: run this on every node.
#
#   NNODES=2 NODE_RANK=0 MASTER_ADDR=node0.example MASTER_PORT=29500 GPUS_PER_NODE=8 \
#       launch/multinode.sh --preset criteo_kaggle --sharding table_row_wise --steps 1000
#
# Each node starts GPUS_PER_NODE ranks (NCCL on GPUs, gloo on CPU-only nodes); torchrun sets
# RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE, which neo_train reads (LOCAL_WORLD_SIZE is
# the node size of table_row_wise / table_column_wise plans). Extra arguments go to
# `neo-train train`; --batch-size is per rank.
set -euo pipefail
: "${NNODES:?set NNODES}" "${NODE_RANK:?set NODE_RANK}" "${MASTER_ADDR:?set MASTER_ADDR}"
MASTER_PORT=${MASTER_PORT:-29500}
source "$(dirname "${BASH_SOURCE[0]}")/_python.sh"
GPUS_PER_NODE=${GPUS_PER_NODE:-$("$PYTHON" -c 'import torch; print(torch.cuda.device_count() or 1)')}
exec "$PYTHON" -m torch.distributed.run \
    --nnodes "$NNODES" --node-rank "$NODE_RANK" --nproc-per-node "$GPUS_PER_NODE" \
    --rdzv-backend c10d --rdzv-endpoint "$MASTER_ADDR:$MASTER_PORT" --rdzv-id "${RDZV_ID:-neo_train}" \
    -m neo_train train "$@"
