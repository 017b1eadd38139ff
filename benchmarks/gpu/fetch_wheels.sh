#!/usr/bin/env bash
# For a GPU machine without network whose Python has PyTorch but not all of fastload's
# dependencies: download, here, the wheels of those it lacks into .whl/ (git ignores them),
# carry .whl/ there, and run_all.sh installs them before the checks.
#   bash benchmarks/gpu/fetch_wheels.sh [NAME ...]     # default: simplejpeg lmdb
# PYVER (default 3.12) is that machine's Python. nvidia-dali-cuda120 is a ~420 MB wheel:
# fetch it only where the transfer to that machine allows it.
set -eu
cd "$(dirname "$0")/../.."
PYVER=${PYVER:-3.12}
[ $# -gt 0 ] || set -- simplejpeg lmdb
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d .whl "$@"
ls -l .whl
