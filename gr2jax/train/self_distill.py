"""Self-distillation of the fast decode from the model's own slow decode (the OPD stage's
`opd.objective='self'`).

The public recipes that keep quality at high parallelism train on the model's own slow-decode
outputs, not on an external teacher (dParallel, arXiv 2509.26488; d3LLM; DMax): this is the
SFT-cost form of Diffusion-GR2's "OPD as a latency lever" (arXiv 2607.01170), where the fast
decode is distilled from the same model's slow decode.

  - Targets: each step decodes the batch's prompts with the model's own greedy slow decode (the
    policy's evaluation decode at decode.eval_tau, 1.0 by default: one token per step) from the
    current params, and keeps the answers that are valid permutations of D (answer parsing, as
    the reward reads them, gr2jax/train/rewards.py); an invalid answer is not trained on
    (example_mask False, zero weights).
  - Loss: CFT's masked-diffusion cross-entropy on those answers (train/cft.py, uniform rates
    U(eps, 1), complementary masks), plus its certainty-forcing term (dParallel: the entropy at
    temperature 0.5 on the masked positions the model already predicts right, weight
    opd.certainty), which raises the confidence of what the slow decode already writes, so a
    threshold decoder commits more of it per step.
"""

import numpy as np

from gr2jax.data.batches import Batch
from gr2jax.decoding import policy as policy_lib
from gr2jax.train import rewards

# The Batch fields the targets replace (the rows keep prompt_tokens, prompt_lengths, ...).
TARGET_FIELDS = ("response_tokens", "response_lengths", "response_weights", "example_mask")


def targets(policy: policy_lib.Policy, tokenizer, labels, *, pad_id: int, name: str = "self"):
  """The prepare of the self objective: batch -> (the batch with its own valid slow-decode
  answers as the responses, stats {'<name>_valid_rate', '<name>_forwards_per_token'}).

  Args:
    policy: the trained model's policy (its evaluation decode is the slow decode).
    tokenizer: the data build's tokenizer (to parse the answers).
    labels: example index -> that example's candidate label strings (SplitData.labels).
    pad_id: the padding token id (after each row's stop).
    name: the stats' prefix (the held-out probe's decode at the deployed threshold reads the
      same stats of another policy: train/probe.py).

  Returns:
    prepare(params, batch, key) -> (Batch, stats), key unused (the decode is greedy).
  """
  stop = policy.config.eos_token_ids

  def prepare(params: dict, batch: Batch, key) -> tuple[Batch, dict]:
    del key
    out = policy.decode(policy.decoding_params(params), batch.prompt_tokens,
                        batch.prompt_lengths)
    lengths = np.asarray(out.lengths, np.int32)
    row_labels = [labels[int(i)] for i in batch.example_index]
    _, valid, _ = rewards.rollout_rewards(tokenizer, out.tokens, lengths, row_labels,
                                          np.asarray(batch.target_position), stop)
    keep = valid & np.asarray(batch.example_mask, bool)
    width = batch.response_tokens.shape[1]
    tokens = np.where(np.arange(width)[None, :] < lengths[:, None], out.tokens[:, :width],
                      pad_id).astype(np.int32)
    weights = (np.arange(width)[None, :] < lengths[:, None]) & keep[:, None]
    real = np.asarray(batch.example_mask, bool)
    stats = {f"{name}_valid_rate": float(valid[real].mean()) if real.any() else 0.0,
             f"{name}_forwards_per_token": float(out.nfe.sum() / max(lengths.sum(), 1))}
    return batch.replace(response_tokens=tokens, response_lengths=lengths,
                         response_weights=weights.astype(np.float32), example_mask=keep), stats

  return prepare
