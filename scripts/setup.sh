#!/usr/bin/env bash
# Create .venv (Python 3.11 or 3.12), install the pinned requirements and gr2jax itself
# (editable, so `import gr2jax` works from any directory). SETUP_AOT=1 also installs the
# compile-only GPU / TPU compilers of requirements-aot.txt (what the test command's compile
# check needs; scripts/test.sh sets it). Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
if ! .venv/bin/python -c "import jax, flax, transformers, torch" 2>/dev/null \
   || [ requirements.txt -nt .venv/.installed ] || [ pyproject.toml -nt .venv/.installed ]; then
  .venv/bin/pip install -q --disable-pip-version-check -r requirements.txt
  .venv/bin/pip install -q --disable-pip-version-check --no-deps -e .
  touch .venv/.installed
fi
if [ "${SETUP_AOT:-0}" = 1 ] && { ! .venv/bin/python -c "import jax_plugins.xla_cuda12, libtpu" \
     2>/dev/null || [ requirements-aot.txt -nt .venv/.installed-aot ]; }; then
  .venv/bin/pip install -q --disable-pip-version-check -r requirements-aot.txt
  touch .venv/.installed-aot
fi
