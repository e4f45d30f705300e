"""Settings shared by every training / evaluation config (each field commented).

Stage configs call `get_common_config(stage)` and override what differs. Everything here can be
overridden on the command line, e.g. `--config.train.steps=100 --config.eval.limit=200`.
"""

import os
import sys

import ml_collections

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from data import get_data_config  # noqa: E402


def get_common_config(stage: str) -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.stage = stage  # experiments/run.py STAGES key; also the directory under --workdir
  c.data = get_data_config()  # the data build this run trains on (cached in the workdir)
  c.init = "preset:tiny"  # 'preset:NAME' (fresh ModelConfig.NAME sized to the tokenizer) or a
  #                         checkpoint / HF dir (a previous stage's <workdir>/<stage>/export)

  c.mesh = ml_collections.ConfigDict()
  c.mesh.data = 1  # data-parallel replicas
  c.mesh.fsdp = -1  # parameter-sharded data parallelism (-1 = the remaining devices)
  c.mesh.tp = 1  # tensor parallelism

  c.model = ml_collections.ConfigDict()
  c.model.remat = "none"  # 'none' | 'full' (recompute each layer in the backward pass)
  c.model.attention_chunk_bytes = 8 << 20  # f32 attention scores per query chunk (8 MiB: CPU)
  c.model.param_dtype = ""  # '' keeps the checkpoint's dtype; 'bfloat16' (fp32 moments) / 'float32'

  c.train = ml_collections.ConfigDict()
  c.train.steps = 600  # optimiser steps (the run ends there; step-capped, not epochs)
  c.train.batch_size = 32  # rows per step (RL: prompts per step, each with G rollouts)
  c.train.micro_batches = 1  # gradient-accumulation micro-batches per step
  c.train.prepare_chunk = 0  # rows per rollout / prepare-forward call (teacher log-probs, pi_old)
  #                            of the RL / OPD stages (0 = all rows at once; else a multiple of
  #                            the mesh's batch shards, data x fsdp)
  c.train.seed = 0  # init, shuffling and per-step randomness (fold_in(key, step))
  c.train.save_every = 100  # steps between run checkpoints
  c.train.keep = 3  # run checkpoints kept
  c.train.async_save = True  # orbax async checkpointing
  c.train.eval_every = 0  # steps between periodic evaluations (0 = only the final one)
  c.train.limit = 0  # use only the first N training examples (0 = all; smoke runs)
  c.train.restart = False  # True: move this stage's checkpoints + logs aside, start from init
  #                          (a resume refuses checkpoints written with other settings)

  c.optimizer = ml_collections.ConfigDict()
  c.optimizer.learning_rate = 1e-3  # peak learning rate
  c.optimizer.warmup_steps = 50  # linear warm-up steps
  c.optimizer.schedule = "cosine"  # 'cosine' (to end_lr_factor * lr) | 'constant'
  c.optimizer.end_lr_factor = 0.1  # cosine floor as a fraction of the peak
  c.optimizer.total_steps = c.train.get_ref("steps")  # schedule length
  c.optimizer.b1 = 0.9
  c.optimizer.b2 = 0.98
  c.optimizer.eps = 1e-8
  c.optimizer.weight_decay = 0.01  # AdamW decay (never on norm scales)
  c.optimizer.clip_norm = 1.0  # global-norm clipping (0 = off)

  c.eval = ml_collections.ConfigDict()
  c.eval.split = "test_1615"  # 'test_1615' (the paper's 1,615 users) | 'test' | 'validation'
  c.eval.limit = 0  # evaluate only the first N examples (0 = all)
  c.eval.batch_size = 256  # decode batch size
  c.eval.tau = 1.0  # diffusion commit threshold (quality mode 1.0; ignored for AR)
  c.eval.max_steps_per_block = 64  # diffusion denoising-step cap per block (paper: 64)
  return c


def use_qwen3_8b_model(c: ml_collections.ConfigDict) -> None:
  """The paper-scale model settings every `:qwen3_8b` variant shares: bf16 params (fp32 Adam
  moments), layer remat, accelerator-sized attention chunks."""
  c.model.remat = "full"
  c.model.param_dtype = "bfloat16"
  c.model.attention_chunk_bytes = 1 << 30


def use_constant_lr(c: ml_collections.ConfigDict, learning_rate: float, warmup_steps: int) -> None:
  """The on-policy stages' optimiser (AR RL, OPD, RL): constant lr after a short warm-up, no
  weight decay (the paper: constant 1e-6 for OPD, 5e-7 for RL)."""
  c.optimizer.learning_rate = learning_rate
  c.optimizer.schedule = "constant"
  c.optimizer.warmup_steps = warmup_steps
  c.optimizer.weight_decay = 0.0
