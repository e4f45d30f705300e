"""Records tests/train/prepare_reference.npz from the three prepares of commit d57e6af.

  .venv/bin/python -m tests.train.record_prepare_reference

Runs AR RL (train/ar_rl.py), diffusion RL (train/trace_rl.py) and OPD (train/opd.py) `prepare`,
each stage's loss on its prepared batch, and the SFT loss, on 1-layer toy models, seeded; the
unified prepare (tests/train/test_rollouts.py) must reproduce them. Run once at d57e6af, before
the refactor that replaced these prepares (so this script only runs at that commit).
"""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax  # noqa: E402
import numpy as np  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")

from gr2jax.train import ar_rl, opd, rewards, sft, trace_rl  # noqa: E402
from tests.train.toy_policy import (  # noqa: E402
  AR,
  BATCH,
  DIFFUSION,
  LABELS,
  ROUNDS,
  TEACHER,
  AnswerTokenizer,
  sft_batch,
  toy_params,
)

OUT = os.path.join(os.path.dirname(__file__), "prepare_reference.npz")


def main():
  ar_params, student, teacher = toy_params()
  tok = AnswerTokenizer()
  out = {}
  ar, stats = ar_rl.prepare(ar_params, BATCH, jax.random.key(1), config=AR, tokenizer=tok,
                            labels_of=lambda i: LABELS, group_size=3, temperature=1.0,
                            max_new_tokens=10, alpha=0.2, chunk_rows=4)
  loss = ar_rl.ar_rl_loss(ar_params, ar, None, config=AR, temperature=1.0, eps_low=0.2,
                          eps_high=0.2)
  out.update({f"ar/{k}": v for k, v in ar.items()})
  out.update({f"ar/stats/{k}": v for k, v in stats.items()})
  out.update(_loss("ar", loss))

  def reward_fn(tokens, lengths, rows):
    return rewards.rollout_rewards(tok, tokens, lengths, [LABELS] * len(tokens),
                                   np.asarray(rows["target_position"]), DIFFUSION.eos_token_ids,
                                   alpha=0.2)[0]

  decode = dict(threshold=0.03, max_steps_per_block=8, max_new_tokens=10, temperature=1.0,
                num_rounds=ROUNDS, chunk_rows=4)
  rl, stats = trace_rl.prepare(student, BATCH, jax.random.key(4), config=DIFFUSION,
                               reward_fn=reward_fn, group_size=3, **decode)
  loss = trace_rl.trace_rl_loss(student, rl, None, config=DIFFUSION, temperature=1.0)
  out.update({f"rl/{k}": v for k, v in rl.items() if k != "replay_rounds"})
  out["rl/num_rounds"] = np.int32(rl["replay_rounds"].shape[1])
  out.update({f"rl/stats/{k}": v for k, v in stats.items()})
  out.update(_loss("rl", loss))

  distil, stats = opd.prepare(student, BATCH, jax.random.key(3), config=DIFFUSION,
                              teacher_params=teacher, teacher_config=TEACHER, group_size=2,
                              **decode)
  loss = opd.opd_loss(student, distil, None, config=DIFFUSION)
  out.update({f"opd/{k}": v for k, v in distil.items() if k != "replay_rounds"})
  out["opd/num_rounds"] = np.int32(distil["replay_rounds"].shape[1])
  out.update({f"opd/stats/{k}": v for k, v in stats.items()})
  out.update(_loss("opd", loss))

  out.update(_loss("sft", sft.sft_loss(ar_params, sft_batch(), None, config=AR)))
  np.savez_compressed(OUT, **{k: np.asarray(v) for k, v in out.items()})
  print({k: np.shape(v) for k, v in out.items()})


def _loss(name, loss):
  total, weight, aux = loss
  return {f"{name}/loss_sum": total, f"{name}/weight": weight,
          **{f"{name}/aux/{k}": v for k, v in aux.items()}}


if __name__ == "__main__":
  main()
