"""GR2's teacher stage (gr2jax/data/llm_teacher.py): reasoning traces written by a local LLM,
rejection-sampled, resumable.

  python experiments/run.py --config=teacher.py --workdir=W \
      --config.teacher.hf_dir=/models/Qwen3-32B          (paper: Qwen3-32B, 'chat' prompt)
  python experiments/run.py --config=teacher.py:tiny --workdir=W \
      --config.teacher.hf_dir=W0/sft/export              (a model trained here, 'data' prompt)

Writes W/teacher/traces.jsonl (the accepted traces) and W/teacher/summary.json; train on them with
`--config.data.teacher_traces=W/teacher/traces.jsonl` (same `data` overrides otherwise). A rerun of
the same command resumes.
"""

import os
import sys

import ml_collections

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from data import get_data_config  # noqa: E402


def get_config(variant: str = ""):
  c = ml_collections.ConfigDict()
  c.stage = "teacher"  # experiments/run.py STAGES key
  c.data = get_data_config()  # the data build whose training users get traces (its lists, SIDs)
  t = c.teacher = ml_collections.ConfigDict()
  t.hf_dir = ""  # the teacher: a local HF Qwen3 dir or a gr2jax checkpoint (required)
  t.tokenizer_dir = ""  # '' = hf_dir's own tokenizer, else the data build's (a model trained here)
  t.prompt = "chat"  # 'chat' (GR2's rejection prompt, the tokenizer's chat template, thinking
  #                    off) or 'data' (the data build's own prompt, as a model trained here reads)
  t.attempts = 4  # k, the most samples per user (rejection sampling; the paper gives none)
  t.temperature = 0.7  # sampling temperature (0 = greedy, then attempts must be 1)
  t.top_p = 0.95  # nucleus sampling mass (1 = off)
  t.max_new_tokens = 512  # response cap per attempt (GR2: ~130 reasoning tokens + 10 labels)
  t.batch_size = 64  # rows per generate call (static; a multiple of the mesh's batch shards)
  t.num_users = 0  # training users answered (0 = all), a seeded sample (a larger one extends it)
  t.seed = 0  # user sample and sampling keys (batch b: fold_in(key(seed), b))
  t.param_dtype = "auto"  # 'auto' (bf16 on accelerators, the checkpoint's dtype on CPU),
  #                         'float32' or 'bfloat16'
  t.mesh = (1, -1, 1)  # (data, fsdp, tp) mesh sizes; -1 = the remaining devices
  t.out_dir = ""  # output directory ('' = <workdir>/teacher)
  if variant == "tiny":  # the tiny AR GR2 (a model trained here) as the teacher, on CPU
    t.prompt = "data"
    t.max_new_tokens = 48  # the tiny build's longest training response (36 tokens), rounded up
    t.temperature = 1.0  # the model's own distribution
    t.top_p = 1.0
    t.batch_size = 128
    t.num_users = 1000
  elif variant:
    raise ValueError(f"teacher.py: unknown variant {variant!r}; expected '' or 'tiny'")
  return c
