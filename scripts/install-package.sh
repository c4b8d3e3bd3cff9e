#!/bin/sh
# Install tpu-operator from one of its lock files into a fresh virtualenv.
#   scripts/install-package.sh LOCK VENV_DIR [SOURCE_DIR]
# LOCK names a lock file in requirements/ (operator, worker, worker-cpu; `make lock`
# writes them from pyproject.toml). Every dependency comes from the lock file, pinned and
# checked against its hashes; the project itself is then built from SOURCE_DIR without
# build isolation and without an index, with the build backend the lock file installed.
# The operator image (Dockerfile), the worker image (worker-image/Dockerfile), the local
# demo and the benchmarks all install through this script.
set -eu
lock="$1"
venv="$2"
source_dir="${3:-.}"
requirements="$source_dir/requirements/$lock.txt"
if [ ! -f "$requirements" ]; then
  echo "install-package.sh: no lock file $requirements; LOCK is the name of a file in" \
    "requirements/: $(ls "$source_dir/requirements" 2>/dev/null | sed 's/\.txt$//' | tr '\n' ' ')" >&2
  exit 2
fi
python3 -m venv "$venv"
pip="$venv/bin/pip"
"$pip" install --no-cache-dir --quiet --disable-pip-version-check \
  --require-hashes --no-deps -r "$requirements"
"$pip" install --no-cache-dir --quiet --disable-pip-version-check \
  --no-deps --no-build-isolation --no-index "$source_dir"
