"""The `serve` block as one typed value: `ServeSpec`, every field of the block (declared with its
default, doc and bounds in gr2jax/tool_settings.py ServeSettings), checked once when it is built
(`ServeSpec.of(block, 'serve.')`) and passed whole to the server (server.py) and the engine
(engine.py).

The three fields serve.mode, serve.draft_ks and serve.cost_table give one typed decoder choice,
`choice` (auto.Choice: auto.Fixed or auto.Auto, auto.py), derived once when the spec is built,
which the engine asks which decoder serves a batch bucket.

A field is checked here on its own; what depends on the model and its build is checked when the
engine is built, before anything compiles (engine.check_fits): serve.prompt_lengths' widest
must hold the build's prompt width P, and serve.max_new_tokens after it must fit every model's
max_position_embeddings.
"""

import dataclasses
import functools

from gr2jax import tool_settings
from gr2jax.apps.serve import auto


@dataclasses.dataclass(frozen=True, kw_only=True)
class ServeSpec(tool_settings.ServeSettings):
  """The `serve` block (its fields: tool_settings.ServeSettings), typed and checked ('{workdir}'
  in ckpt, verify_with and compilation_cache is filled in by the caller), with `choice`, the
  decoder choice of mode, draft_ks and cost_table: auto.Fixed() or auto.Auto(draft_ks,
  cost_table)."""

  def check(self, where: str) -> None:
    """The decoder choice is built (a cost table in mode 'fixed' refused) and has the verifier
    it needs ('auto' refused without verify_with)."""
    self.choice.check_verifier(self.verify_with)

  @functools.cached_property
  def choice(self) -> auto.Choice:
    """The typed decoder choice of mode, draft_ks and cost_table (derived once)."""
    return auto.CHOICES[self.mode].of_block(self.draft_ks, self.cost_table)
