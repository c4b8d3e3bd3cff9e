#!/bin/sh
# Install tpu-operator with one extra into a fresh virtualenv.
#   scripts/install-package.sh EXTRA VENV_DIR [SOURCE_DIR]
# The operator image (Dockerfile), the worker image (worker-image/Dockerfile) and the
# end-to-end tests all install through this script, so what the tests run is what the
# images contain.
set -eu
extra="$1"
venv="$2"
source_dir="${3:-.}"
python3 -m venv "$venv"
"$venv/bin/pip" install --no-cache-dir --quiet --upgrade pip
"$venv/bin/pip" install --no-cache-dir --quiet "${source_dir}[${extra}]"
