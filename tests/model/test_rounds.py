"""gr2jax/model/rounds.py: Rounds is a static pytree value (no leaves; jit specialises on it)."""

import jax
import jax.numpy as jnp

from gr2jax.diffusion import replay
from gr2jax.model.rounds import Rounds


def test_rounds_has_no_leaves_and_jit_compiles_once_per_count():
  traces = []

  @jax.jit
  def width(batch):
    traces.append(batch["rounds"].count)
    return jnp.zeros(batch["rounds"].count + 1) + batch["x"]

  assert jax.tree.leaves({"rounds": Rounds(3)}) == []
  assert width({"rounds": Rounds(3), "x": 1.0}).shape == (4,)
  assert width({"rounds": Rounds(3), "x": 2.0}).shape == (4,)
  assert width({"rounds": Rounds(5), "x": 1.0}).shape == (6,)
  assert traces == [3, 5]
  assert replay.Rounds is Rounds  # where the replay's callers read it
