"""On-policy distillation (OPD) from the frozen AR GR2 teacher; Diffusion-GR2, arXiv 2607.01170,
OPD.

  L_OPD = E_P E_{o ~ pi_theta} [ (1/|o|) sum_t KL( pi_AR(. | P, o_<t) || pi_theta(. | ctx_t) ) ]

a forward KL over every committed response token t (|o| = the response length, stop token
included; tokens the decoder committed after the stop are context, not terms).

  - Trajectories: the student (a DiffusionRollout, train/rollout.py) samples G' rollouts per
    prompt with its real decoder (`block_diffusion_generate` at the decode spec's rollout tau
    and temperature > 0) in train/rollouts.py `prepare`, outside the jitted step.
  - Teacher: scores each trajectory ONCE with the one causal scorer over [prompt | o]
    (`teacher_log_probs`, the `teacher` part of `prepare`); its full distributions at the
    committed positions are cached in the batch ([B, M, V]; `teacher_dtype` may halve them).
  - Student context ctx_t (`context`, config opd.context), read by replaying the trajectory
    (gr2jax/diffusion/replay.py); a block's seed is read where the decoder proposed it (the
    previous block's commit forward, or the prefill) in both:
      'commit_step'  its own decoding canvas: the prompt, the clean earlier blocks and the
                     block's canvas at the step t was committed (the tokens committed at earlier
                     steps visible, the rest masked), "its own decoding context";
      'left_clean'   the paper's literal (P, o_<t): the block's canvas with o_<t clean and the
                     rest masked, i.e. the replay of a left-to-right commit order
                     (`left_to_right_steps`); B - 1 replay rounds per trajectory.
    Both sides use the AR token shift, so they are read at the same index (the query before t).
  - Both distributions are `commit.token_log_probs` at temperature 1 (the mask token removed
    from both sides, renormalised over the rest). Our choice: the KL compares the untempered
    policies; the sampling temperature only decides which trajectories are visited.

Normalisation: the per-trajectory mean over its tokens, then the mean over trajectories (the
paper's (1/|o|)): loss_sum = sum_i (1/|o_i|) sum_t KL_it, weight = number of trajectories.
"""

import dataclasses

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from gr2jax.data.batches import Batch
from gr2jax.decoding.policy import causal_log_probs
from gr2jax.diffusion import replay
from gr2jax.diffusion.decode import NEVER_STEP, SEED_STEP
from gr2jax.model.config import ModelConfig
from gr2jax.train import rollouts
from gr2jax.train.rollout import DiffusionRollout

# opd.teacher_dtype -> the storage dtype of the cached teacher log-probs [B, M, V] (the setting's
# choices, stage_registry.OPDSettings; bf16 halves them: at the paper's shapes [512, 256, 151,936]
# 80 GB per step in f32; the loss reads them back as f32).
TEACHER_DTYPES = {"float32": np.dtype(np.float32), "bfloat16": np.dtype(ml_dtypes.bfloat16)}


def left_to_right_steps(commit_step: np.ndarray, block_size: int) -> np.ndarray:
  """The step map of a left-to-right commit order over the same committed tokens.

  Round s of its replay masks, in every block, the tokens at in-block index >= s + 1 and scores
  index s + 1 at the query before it: token t is read with o_<t of its block clean and the rest
  masked. Seeds (index 0) and never-committed slots keep their marks.

  Args:
    commit_step: [B, M] int the decoder's trace (DiffusionOutput.commit_step).
    block_size: B.

  Returns:
    [B, M] int32: in-block index - 1 where a token was denoised, else commit_step's mark.
  """
  steps = np.asarray(commit_step, np.int32)
  index = np.arange(steps.shape[1], dtype=np.int32) % block_size
  denoised = (steps != SEED_STEP) & (steps != NEVER_STEP)
  return np.where(denoised, index[None, :] - 1, steps).astype(np.int32)


def student_context(batch: Batch, context: str, rollout: DiffusionRollout) -> Batch:
  """The prepared batch with the trace replayed in `context` (module docstring): unchanged for
  'commit_step'; 'left_clean' replaces commit_step by `left_to_right_steps` and the replay's
  round count by the bucket those steps need."""
  if context == "commit_step":
    return batch
  steps = left_to_right_steps(batch.commit_step, rollout.config.block_size)
  rounds = replay.round_bucket(steps, rollout.max_rounds, rollout.shrink)
  return batch.replace(commit_step=steps, replay_rounds=replay.Rounds(rounds))


def teacher_log_probs(
  teacher_params: dict,
  teacher_config: ModelConfig,
  prompt_tokens: jax.Array,
  prompt_lengths: jax.Array,
  response_tokens: jax.Array,
  response_lengths: jax.Array,
  *,
  mask_token_id: int,
) -> jax.Array:
  """The AR teacher's distribution before every response token: the one causal scorer
  (policy.causal_log_probs) with the student's mask token removed, at temperature 1.

  Args:
    teacher_params: the frozen teacher's params.
    teacher_config: an AR model (block_size 1).
    prompt_tokens: [B, P] right-padded prompts.
    prompt_lengths: [B].
    response_tokens: [B, M] the trajectories (a DiffusionRollout's response_tokens).
    response_lengths: [B].
    mask_token_id: the student's mask token, removed from the teacher's distribution.

  Returns:
    [B, M, V] f32 log pi_AR(. | P, o_<j).
  """
  if teacher_config.block_size != 1:
    raise ValueError(f"teacher_log_probs: the teacher must be AR, got block_size="
                     f"{teacher_config.block_size}")
  config = dataclasses.replace(teacher_config, mask_token_id=mask_token_id)
  _, logp = causal_log_probs(teacher_params, config, prompt_tokens, prompt_lengths,
                             response_tokens, response_lengths, return_log_probs=True)
  return logp


_teacher_log_probs = jax.jit(
  teacher_log_probs, static_argnames=("teacher_config", "mask_token_id")
)


def teacher(teacher_params: dict, teacher_config: ModelConfig, *, mask_token_id: int,
            dtype=np.float32) -> rollouts.TeacherFn:
  """OPD's part of rollouts.prepare: a chunk's teacher distributions, stored in `dtype`.

  Args:
    teacher_params: the frozen AR teacher's params.
    teacher_config: the teacher (block_size 1, the student's vocabulary).
    mask_token_id: the student's mask token.
    dtype: storage dtype of the cached distributions (`TEACHER_DTYPES[name]`: float32, or
      bfloat16 to halve the [B, M, V] cache).
  """
  def fn(chunk: Batch):
    logp = _teacher_log_probs(
      teacher_params, teacher_config, chunk.prompt_tokens, chunk.prompt_lengths,
      chunk.response_tokens, chunk.response_lengths, mask_token_id=mask_token_id)
    return logp.astype(dtype)  # on the device: only the stored bytes come back

  return fn


def forward_kl(teacher_logp: jax.Array, student_logp: jax.Array, mask_token_id: int) -> jax.Array:
  """KL(teacher || student) per position over the vocabulary without the mask token.

  Args:
    teacher_logp: [..., V] log-probs (mask token at -inf).
    student_logp: [..., V] log-probs (mask token at -inf).
    mask_token_id: the excluded column.

  Returns:
    [...] f32 sum_v p_T(v) (log p_T(v) - log p_S(v)).
  """
  t = teacher_logp.astype(jnp.float32).at[..., mask_token_id].set(0.0)
  s = student_logp.astype(jnp.float32).at[..., mask_token_id].set(0.0)
  p = jnp.exp(teacher_logp.astype(jnp.float32))  # 0 at the mask token
  return jnp.sum(p * (t - s), axis=-1)


def fields(rollout: DiffusionRollout) -> tuple[str, ...]:
  """The Batch fields opd_loss reads: the student's replay (its rollout's `fields`) and
  example_mask, trace_tokens, teacher_log_probs."""
  return tuple(dict.fromkeys(rollout.fields + (
    "example_mask", "response_lengths", "trace_tokens", "teacher_log_probs")))


def opd_loss(params: dict, batch: Batch, key: jax.Array, *, rollout: DiffusionRollout):
  """The OPD loss on prepared trajectories (train-step contract; module docstring).

  Args:
    params: the student's params.
    batch: from rollouts.prepare with a teacher (`fields`): prompt_tokens [B, P],
      prompt_lengths [B], example_mask [B], a DiffusionRollout's fields (trace_tokens,
      commit_step, response_lengths, replay_rounds), teacher_log_probs [B, M, V].
    key: unused (the trajectories are in the batch).
    rollout: the student's rollout (its replay gives its distributions in its own decoding
      contexts).

  Returns:
    (loss_sum = sum_i (1/|o_i|) sum_t KL_it, weight = trajectories, aux sums
     {'student_logp', 'teacher_logp'}: per-trajectory mean log-prob of the sampled tokens).
  """
  del key
  logp, student = rollout.log_probs(params, batch, temperature=0.0, return_log_probs=True)
  teacher_logp = jnp.asarray(batch.teacher_log_probs, jnp.float32)
  kl = forward_kl(teacher_logp, student, rollout.config.mask_token_id)  # [B, M]
  m = kl.shape[1]
  lengths = jnp.asarray(batch.response_lengths, jnp.int32)
  tokens = (jnp.arange(m)[None, :] < lengths[:, None]).astype(jnp.float32)
  row = jnp.asarray(batch.example_mask, jnp.float32) / jnp.maximum(lengths, 1)  # [B]
  per_token = tokens * row[:, None]  # 1/|o_i| on o_i's tokens
  teacher_chosen = jnp.take_along_axis(teacher_logp, batch.trace_tokens[..., None],
                                       axis=-1)[..., 0]
  scored = per_token > 0  # never-committed slots hold the mask token (log-prob -inf)
  aux = {
    "student_logp": jnp.sum(jnp.where(scored, logp, 0.0) * per_token),
    "teacher_logp": jnp.sum(jnp.where(scored, teacher_chosen, 0.0) * per_token),
  }
  return jnp.sum(kl * per_token), jnp.sum(jnp.asarray(batch.example_mask, jnp.float32)), aux
