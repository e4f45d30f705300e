#!/usr/bin/env bash
# README command 2, what CI runs: the install with the compile-only GPU / TPU compilers (the
# compile checks need them), lint, the default tests (neither slow nor integration; ~10 min on 2
# cores), the integration tests (the HF-layout recipe end to end, the GPU / TPU compilers,
# multi-process and 8-device runs), then the Table 2 smoke. Arguments go to the default run.
set -euo pipefail
cd "$(dirname "$0")/.."
SETUP_AOT=1 bash scripts/setup.sh
.venv/bin/ruff check gr2jax experiments weights_conversion tests
.venv/bin/python -W error::DeprecationWarning -m pytest -q "$@"
.venv/bin/python -W error::DeprecationWarning -m pytest -q -m integration
# The Table 2 smoke: every stage on a few hundred examples, every row produced (not the numbers).
smoke=$(mktemp -d)
GR2JAX_PROGRESS=0 .venv/bin/python experiments/run.py --config=table2.py:smoke --workdir="$smoke" \
  2>&1 | grep -E "^\[|^\|" || { echo "table2 smoke failed (log: rerun the command above)"; exit 1; }
test -s "$smoke/results/table2.md" && echo "table2 smoke: every row written"
rm -rf "$smoke"
