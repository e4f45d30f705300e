"""AR RL prepare on a tiny 1-layer model (fp32, CPU): rollouts and pi_old in row chunks."""

import jax
import numpy as np

from gr2jax.model.config import ModelConfig
from gr2jax.model.params import init_params
from gr2jax.train import ar_rl

CONFIG = ModelConfig.tiny(vocab_size=64, num_layers=1, eos_token_ids=(2,), pad_token_id=0)
BATCH = {"prompt_tokens": np.array([[5, 6, 7, 8, 9, 0], [10, 11, 12, 0, 0, 0]], np.int32),
         "prompt_lengths": np.array([5, 3], np.int32), "example_mask": np.ones(2, bool),
         "example_index": np.array([0, 1], np.int32),
         "target_position": np.array([1, 0], np.int32)}


class _Tokenizer:
  """Decodes every response to text that is not an answer (reward -1: groups are dropped)."""

  def decode(self, ids, skip_special_tokens=False):
    return " ".join(map(str, ids))


def test_chunked_prepare_gives_the_pi_old_of_one_call():
  """2 prompts x G = 3 rollouts in calls of 4 rows (the last padded): pi_old of the sampled
  responses equals one unchunked teacher-forced forward."""
  params = init_params(CONFIG, jax.random.key(0))
  train, stats = ar_rl.prepare(params, BATCH, jax.random.key(1), config=CONFIG,
                               tokenizer=_Tokenizer(), labels_of=lambda i: ("<a>", "<b>"),
                               group_size=3, temperature=1.0, max_new_tokens=8, alpha=0.2,
                               chunk_rows=4)
  assert train["response_tokens"].shape == (6, 8) and train["logp_old"].shape == (6, 8)
  assert stats["valid_rate"] == 0.0 and np.all(train["token_weights"] == 0)
  np.testing.assert_array_equal(train["prompt_lengths"], [5, 5, 5, 3, 3, 3])
  whole = ar_rl.response_log_probs(params, CONFIG, train, 1.0)
  np.testing.assert_allclose(train["logp_old"], whole, atol=1e-6)
