#!/bin/bash
# RUNS="FA FB ..." ./sweep.sh VARIANT TAG [sim_validation args]: rescore each kept run with exp.py
V=$1; T=$2; shift 2
for r in ${RUNS:-FA FB FC FD FE FF FG FH FI FJ FK FL FM}; do
  d=/tmp/keeps/$r/keep; [ -d $d ] || d=/tmp/$r/keep
  python /work/main/notes/sim_validation_bench/session35_2026-11-29/exp.py $V $d "$@" --json /tmp/s35/${T}_$r.json > /tmp/s35/${T}_$r.txt 2>&1 || echo "fail $r"
done
