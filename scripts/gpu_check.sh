#!/usr/bin/env bash
# The GPU check: one prepared run for a machine with a GPU, <= 10 min (experiments/bench_gpu_check.py).
#
#   bash scripts/gpu_check.sh                                  # qwen3_8b, random bf16 weights
#   bash scripts/gpu_check.sh --out_dir=runs/gpu_check_h100    # choose where the results go
#   bash scripts/gpu_check.sh --preset=tiny --out_dir=runs/gc  # CPU smoke run (tests/test_gpu_check.py)
#
# Measures AR decode tokens/s + model-bandwidth utilisation at batch 1, block diffusion vs AR at
# tau 0.9 / 0.6 / 0.4 with a forced K-tokens-per-step schedule, SFT / CFT train-step MFU at the
# largest micro-batch that fits, and the bf16 flip rate of AR and the lossless mode at batch 1 / 8
# / 16 against the teacher-forced check (gr2jax/decoding/exactness.py); writes OUT/gpu_check.json and OUT/gpu_check.md (+ a log per
# section). Needs the project venv (.venv, scripts/setup.sh) with a CUDA jaxlib on a GPU box,
# e.g. `.venv/bin/pip install -U "jax[cuda12]==$(.venv/bin/python -c 'import jax; print(jax.__version__)')"`.
# Every other flag is passed to experiments/bench_gpu_check.py.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"
# The checkout's gr2jax and experiments packages for a $PYTHON without the editable install
# (a GPU image's own Python with the pinned packages).
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# Let XLA use most of the card (the default 75% would cap the train section's micro-batch).
export XLA_PYTHON_CLIENT_MEM_FRACTION="${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.95}"
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-1}"
"$PYTHON" -c 'import jax; print("[gpu_check] jax", jax.__version__, "devices", jax.devices())'
exec "$PYTHON" experiments/bench_gpu_check.py "$@"
