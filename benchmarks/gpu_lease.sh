#!/usr/bin/env bash
# One call on a lent GPU machine (the device tool): the GPU test tier, then the GPU suite; or the
# simulator's validation on GPU traces (simval: sim_validation.py --device cuda, its kept traces and
# calibrations tarred into $OUT (simval_keep.tar.gz) for --rescore here). Logs and reports land under $OUT (the tool
# brings them back). Not used by CI.
#   bash benchmarks/gpu_lease.sh tier|suite|all|simval   env: N (xdist workers), TIER_S, SUITE_S,
#                                                   TESTS (pytest args), SUITE_ARGS, SIMVAL_S, SIMVAL_ARGS
set -u
# neo_train without installing it: the repository root on the path (PYTHONSAFEPATH: the same path
# in subprocesses too, whatever their working directory)
export PYTHONUNBUFFERED=1 PYTHONSAFEPATH=1 PYTHONPATH="$PWD:$PWD/benchmarks${PYTHONPATH:+:$PYTHONPATH}"
# wheels carried in .whl/ (carry: [".whl"]): the runtime needs the device image lacks (tomli-w)
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
OUT=${OUT:-/tmp/gpu_out}
mkdir -p "$OUT"
PY=${PY:-python3}
what=${1:-all}
{
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv
  $PY -c "import sys, torch, triton; print(sys.version.split()[0], torch.__version__, torch.version.cuda, 'triton', triton.__version__, torch.cuda.get_device_name())"
} 2>&1 | tee "$OUT/env.txt"
if [[ $what == tier || $what == all ]]; then
  timeout "${TIER_S:-330}" $PY -m pytest -m gpu -q -rfEs --durations=12 -p no:cacheprovider \
    -n "${N:-6}" ${TESTS:-tests} > "$OUT/tier.log" 2>&1
  echo "tier rc=$?" >> "$OUT/tier.log"
  grep -E "passed|failed|error|rc=" "$OUT/tier.log" | tail -3
  grep -E "^(FAILED|ERROR|SKIPPED)" "$OUT/tier.log" | cut -c1-400
fi
if [[ $what == suite || $what == all ]]; then
  timeout "${SUITE_S:-240}" $PY benchmarks/gpu_suite.py ${SUITE_ARGS:-} --json "$OUT/gpu_suite.json" \
    --png "$OUT/gpu_suite.png" > "$OUT/suite.log" 2>&1
  echo "suite rc=$?" >> "$OUT/suite.log"
  tail -45 "$OUT/suite.log"
fi
if [[ $what == simval ]]; then
  keep=/tmp/simval_keep
  timeout "${SIMVAL_S:-450}" $PY benchmarks/sim_validation.py --device cuda ${SIMVAL_ARGS:-} --keep "$keep" \
    --json "$OUT/simval_gpu.json" --png "$OUT/simval_gpu.png" > "$OUT/simval.log" 2>&1
  echo "simval rc=$?" >> "$OUT/simval.log"
  tar -czf "$OUT/simval_keep.tar.gz" -C /tmp simval_keep 2>&1 | tail -2
  grep -E "^(recorded|W=|\[busy)" "$OUT/simval.log" | cut -c1-200 | tail -40
  tail -40 "$OUT/simval.log"
fi
if [[ $what == diag ]]; then
  timeout "${DIAG_S:-300}" $PY benchmarks/gpu_diag.py 2>&1 | tee "$OUT/diag.log"
fi
