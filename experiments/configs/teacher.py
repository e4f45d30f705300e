"""GR2's teacher step (gr2jax/data/llm_teacher.py): reasoning traces written by a local LLM,
rejection-sampled, resumable; the `teacher` block of a recipe (gr2jax/recipes.py).

  python experiments/run.py --config=teacher.py:qwen3_8b --workdir=W --config.hf_dir=DIR \
      --config.teacher.hf_dir=/models/Qwen3-32B          (paper: Qwen3-32B, 'chat' prompt)
  python experiments/run.py --config=teacher.py --workdir=W \
      --config.teacher.hf_dir=W0/sft/export              (tiny: a model trained here, 'data' prompt)

Writes W/teacher/traces.jsonl (the accepted traces) and W/teacher/summary.json for the recipe's
data build; train on them with `--config.data.teacher_traces=W/teacher/traces.jsonl` (table2.py
does this itself when --config.teacher.hf_dir is set). A rerun of the same command resumes.
"""

from gr2jax import recipes


def get_config(variant: str = ""):
  return recipes.config(variant, "teacher")
