"""The GR2 re-ranking reward (GR2, arXiv 2602.07774), one function for AR and diffusion RL.

  R_rank = (r^D - r^o) / N          rank of the target in D minus its rank in the output
  R      = R_rank + alpha * R_fmt   if R_rank > 0 or (r^D = 1 and r^o = 1)   (conditional format)
  R      = R_rank                   otherwise
  R      = -1                       for an invalid, truncated or overflowing output (Diffusion-GR2)

R_fmt = 1 for a valid permutation (binary: the paper gives no partial credit). Ranks are 1-based.
The condition closes the exploit of copying D's order, which would otherwise earn alpha whenever
the target is not already first.

The fast-decode rewards beside it (`speed_rewards`; weighted in train/rl.py, each normalised on
its own in grpo.group_advantages, as LightningRL, arXiv 2603.13319):

  R_valid = 1 for a valid output, 0 otherwise
  R_speed = R_valid * tokens / forwards     the rollout's tokens per decoder forward (TPF)
"""

import numpy as np

from gr2jax.data import answer

INVALID_REWARD = -1.0


def rank_rewards(rankings: np.ndarray, valid: np.ndarray, target_position: np.ndarray, *,
                 alpha: float = 0.2) -> np.ndarray:
  """R = R_rank + alpha * R_fmt (conditional), -1 for invalid rows; GR2 §1.5, Diffusion-GR2 App. B.

  Args:
    rankings: [B, N] int, each row the output's slots best first (ignored where not valid).
    valid: [B] bool, the output parsed into a permutation of D and was not truncated.
    target_position: [B] int, the target's 0-based slot in D.
    alpha: weight of the conditional format reward (paper: 0.2).

  Returns:
    [B] f32 rewards.
  """
  rankings = np.asarray(rankings)
  valid = np.asarray(valid, bool)
  target_position = np.asarray(target_position)
  b, n = rankings.shape
  if valid.shape != (b,) or target_position.shape != (b,):
    raise ValueError(f"rank_rewards: rankings {rankings.shape}, valid {valid.shape}, "
                     f"target_position {target_position.shape} must share the batch size")
  rank_in_d = target_position + 1
  rank_out = np.argmax(rankings == target_position[:, None], axis=1) + 1  # [B]
  r_rank = (rank_in_d - rank_out) / n
  paid = (r_rank > 0) | ((rank_in_d == 1) & (rank_out == 1))
  reward = r_rank + alpha * paid
  return np.where(valid, reward, INVALID_REWARD).astype(np.float32)


def rollout_rewards(tokenizer, tokens: np.ndarray, lengths: np.ndarray, labels: list,
                    target_position: np.ndarray, stop_token_ids: tuple[int, ...], *,
                    alpha: float = 0.2) -> tuple[np.ndarray, np.ndarray, list]:
  """Parses decoded rollouts (AR or diffusion) and scores them with `rank_rewards`.

  A row that did not end with a stop token within its budget (overflow) is invalid, whatever
  its text parses to.

  Args:
    tokenizer: the data build's tokenizer.
    tokens: [B, M] response tokens; lengths: [B] tokens per row (the stop token included).
    labels: [B] tuples of candidate label strings.
    target_position: [B] the target's slot in D.
    stop_token_ids: the ids that end a response.
    alpha: format-reward weight.

  Returns:
    (rewards [B] f32, valid [B] bool, AnswerResults).
  """
  tokens, lengths = np.asarray(tokens), np.asarray(lengths)
  results = [answer.parse_answer(tokenizer.decode(row[:n].tolist(), skip_special_tokens=False),
                                 labels[i])
             for i, (row, n) in enumerate(zip(tokens, lengths, strict=True))]
  last = tokens[np.arange(len(tokens)), np.maximum(lengths - 1, 0)]
  stopped = np.isin(last, stop_token_ids) & (lengths > 0)
  valid = np.asarray([r.valid for r in results], bool) & stopped
  rankings = np.stack([r.ranking for r in results])
  return rank_rewards(rankings, valid, target_position, alpha=alpha), valid, results


def speed_rewards(forwards: np.ndarray, lengths: np.ndarray, valid: np.ndarray) -> np.ndarray:
  """R_speed = tokens per decoder forward of each rollout, 0 for an invalid one (module
  docstring): LightningRL's TPF reward, gated by validity so that speed is never paid for an
  answer that is thrown away.

  Args:
    forwards: [B] int the decoder's forwards on each row (DiffusionOutput.nfe; an AR rollout
      takes one per token).
    lengths: [B] int tokens per row, the stop token included.
    valid: [B] bool.

  Returns:
    [B] f32.
  """
  forwards, lengths, valid = np.asarray(forwards), np.asarray(lengths), np.asarray(valid, bool)
  if not forwards.shape == lengths.shape == valid.shape or forwards.ndim != 1:
    raise ValueError(f"speed_rewards: forwards {forwards.shape}, lengths {lengths.shape}, valid "
                     f"{valid.shape} must be [B] each")
  tpf = lengths / np.maximum(forwards, 1)
  return np.where(valid, tpf, 0.0).astype(np.float32)
