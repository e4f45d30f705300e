"""The command-line tools: run.py (one stage from a config file, configs/), plan.py + targets.py
(the AOT plan, gpu_specs/), bench_gpu_check.py (scripts/gpu_check.sh), bench_serve.py +
serve_modes.py, stage_sweep.py, limits.py (a machine's copy and matmul rates).

Part of the editable install (pyproject.toml), so the tools import one another as
`from experiments import plan` with no sys.path edit, whether run as `python experiments/run.py`
or imported. studies/ holds the one-off measurements written up in docs/results/; the tools never
import a study, and gr2jax/ imports nothing from here.
"""
