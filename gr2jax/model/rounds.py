"""`Rounds`: the replay's static round count S (gr2jax/diffusion/replay.py `round_bucket`) as a
train batch carries it (gr2jax/data/batches.py Batch.replay_rounds).

It stands at the model floor so that the batch type (data/) and the replay (diffusion/, which
re-exports it as replay.Rounds) both read it without data/ importing diffusion/.
"""

import dataclasses

import jax


@jax.tree_util.register_static
@dataclasses.dataclass(frozen=True)
class Rounds:
  """The replay's static round count S of a batch (replay.round_bucket).

  A pytree without leaves: it travels in the train batch dict next to the arrays, and jit
  specialises on its value (one compiled step per count, like a shape), where a traced int could
  not size the packed sequence.

  Attributes:
    count: S >= 0.
  """

  count: int
