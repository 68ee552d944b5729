#!/bin/bash
# sweep2.sh variant "runs" tag [extra args]
cd /work/main
v=$1; tag=$2; shift 2
for r in $RUNS; do
  d=/tmp/keeps/$r/keep; [ -d /tmp/$r/keep ] && d=/tmp/$r/keep
  .venv/bin/python /tmp/s34/exp.py $v $d "$@" --json /tmp/s34/${tag}_${v}_$r.json > /tmp/s34/${tag}_${v}_$r.txt 2>&1
done
echo done >> /tmp/s34/${tag}_${v}.done
