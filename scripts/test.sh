#!/usr/bin/env bash
# The default test run (README command 2): the install with the compile-only GPU / TPU
# compilers (the compile check needs them), lint, every test not marked slow, the Table 2 smoke.
set -euo pipefail
cd "$(dirname "$0")/.."
SETUP_AOT=1 bash scripts/setup.sh
.venv/bin/ruff check gr2jax experiments weights_conversion tests
.venv/bin/python -W error::DeprecationWarning -m pytest -q "$@"
# The Table 2 smoke: every stage on a few hundred examples, every row produced (not the numbers).
smoke=$(mktemp -d)
GR2JAX_PROGRESS=0 .venv/bin/python experiments/run.py --config=table2.py:smoke --workdir="$smoke" \
  2>&1 | grep -E "^\[|^\|" || { echo "table2 smoke failed (log: rerun the command above)"; exit 1; }
test -s "$smoke/results/table2.md" && echo "table2 smoke: every row written"
rm -rf "$smoke"
