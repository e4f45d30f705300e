#!/usr/bin/env bash
# The default test run (README command 2): lint, then every test not marked slow.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check gr2jax experiments weights_conversion tests
.venv/bin/python -W error::DeprecationWarning -m pytest -q "$@"
