#!/usr/bin/env bash
# Every GPU check, one after another, for a GPU machine: bash benchmarks/gpu/run_all.sh
# Each check prints its numbers; on a CPU-only machine (or one without nvidia-dali, for the
# DALI checks) each says it skipped. The checks import fastload from this checkout. Wheels in
# .whl/ (benchmarks/gpu/fetch_wheels.sh: dependencies the machine's Python lacks, for a machine
# without network) are installed into /tmp/fastload-site first (WHEELS names another folder).
# PY picks the Python.
set -u
cd "$(dirname "$0")/../.."
PY=${PY:-python3}
WHEELS=${WHEELS:-.whl}
if compgen -G "$WHEELS/*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/fastload-site "$WHEELS"/*.whl || exit 1
  export PYTHONPATH="/tmp/fastload-site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
"$PY" -c "import torch, fastload; print('torch', torch.__version__, '| CUDA:',
  torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'none', '| fastload',
  fastload.__version__)" || exit 1
status=0
for check in benchmarks/gpu/check_*.py; do
  echo "== $check"
  timeout 240 "$PY" "$check" || status=1
done
exit $status
