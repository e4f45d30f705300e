#!/usr/bin/env bash
# Create .venv (Python 3.11 or 3.12) and install the pinned requirements, plus the compile-only
# accelerator packages of requirements-aot.txt (GPU / TPU compilers for the CI compile check;
# SETUP_AOT=0 skips them). Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
if ! .venv/bin/python -c "import jax, flax, transformers, torch" 2>/dev/null \
   || [ requirements.txt -nt .venv/.installed ]; then
  .venv/bin/pip install -q --disable-pip-version-check -r requirements.txt
  touch .venv/.installed
fi
if [ "${SETUP_AOT:-1}" = 1 ] && { ! .venv/bin/python -c "import jax_plugins.xla_cuda12, libtpu" \
     2>/dev/null || [ requirements-aot.txt -nt .venv/.installed-aot ]; }; then
  .venv/bin/pip install -q --disable-pip-version-check -r requirements-aot.txt
  touch .venv/.installed-aot
fi
