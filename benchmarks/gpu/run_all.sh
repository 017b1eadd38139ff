#!/usr/bin/env bash
# Every GPU check, one after another, for a lent GPU machine: bash benchmarks/gpu/run_all.sh
# Each check prints its numbers; on a CPU-only machine each says it skipped.
set -u
cd "$(dirname "$0")/../.."
PY=${PY:-python}
status=0
for check in benchmarks/gpu/check_*.py; do
  echo "== $check"
  timeout 240 "$PY" "$check" || status=1
done
exit $status
