"""The decode spec: how every evaluation and served request of a recipe decodes.

`DecodeSpec` is one frozen value per recipe (gr2jax/recipe.py carries it whole into every stage
view, `view.decode`, and a stage's export records it), so two stages of one recipe, the tables
and a server of its export cannot decode differently. Its defaults are the paper's decoding
settings (Diffusion-GR2, arXiv 2607.01170): B = 32, eval tau = 1.0 (quality mode), at most 64
denoising steps per block (rollouts use the same cap; their threshold and temperature are each
on-policy stage's own settings, gr2jax/stage_registry.py); gr2jax/recipes.py takes them from
here. Its lossless-mode fields give the draft-and-verify settings (`spec.draft(max_new_tokens)`,
diffusion/speculative.DraftDecoding); policy.py turns the rest into the other decoders' settings
(model/decode_core.Decoding's convention).
"""

import dataclasses

from gr2jax import settings
from gr2jax.diffusion import commit, speculative

# Fields the spec had while it also described OPD's rollouts (now OPD's own settings,
# stage_registry.OPDSettings), at the value every spec then held by default: `record` keeps them,
# so a run record, a step digest and an evaluation cache key stay what they were.
RETIRED_FIELDS = {"rollout_tau": 0.9, "temperature": 1.0}


_DRAFT = speculative.DraftDecoding  # the draft fields' defaults: its own (the floor below)


@dataclasses.dataclass(frozen=True, kw_only=True)
class DecodeSpec(settings.Settings):
  """How every evaluation and served request of a recipe decodes (the one place these
  settings and their defaults are written; gr2jax/recipes.py's `decode` block is built from it).

  block_size is B of the diffusion stages: an AR init is converted to a block-diffusion model of
  this block size; every decoder then reads the model's config.block_size. commit_order is the
  commit order's recorded name; `order` is its commit.CommitOrder, which the decoders take. The
  draft fields are the lossless mode (a block-diffusion drafter verified by an AR model,
  LosslessPolicy; diffusion/speculative.py DraftDecoding): their defaults are the best predicted
  H100 speed-up of the trained tiny pair's acceptance (docs/results/lossless/), K = 16 with
  one-step drafts, written once as DraftDecoding's field defaults and read here.
  """

  WHERE = "decode."

  block_size: int = settings.integer(32, doc="B of the diffusion stages (an AR init is converted "
                                     "to this block size; paper: 32)", minimum=1)
  eval_tau: float = settings.real(1.0, doc="commit threshold of every evaluation (1.0 = one "
                                  "token per step; Table 2's quality mode)", low=0, high=1,
                                  low_open=True)
  max_steps_per_block: int = settings.integer(64, doc="denoising-step cap per block, evaluation "
                                              "and rollouts alike", minimum=1)
  constrained: bool = settings.flag(False, doc="evaluations decode the answer under the answer "
                                    "constraint (diffusion models only; the ablation row)")
  commit_order: str = settings.choice(commit.CONFIDENCE.name, doc="the diffusion commit order "
                                      "('confidence' = the paper's)", choices=commit.ORDERS)
  draft_k: int = settings.integer(_DRAFT.k, doc="lossless mode: tokens drafted per verify "
                                  "forward", minimum=1)
  draft_tau: float = settings.real(_DRAFT.draft_tau, doc="lossless mode: the drafter's commit "
                                   "threshold (0 = a one-step draft)", low=0, high=1,
                                   note=" (0 = a one-step draft)")
  draft_steps: int = settings.integer(_DRAFT.draft_steps, doc="lossless mode: the drafter's "
                                      "step budget per draft", minimum=1)

  def record(self) -> dict:
    """The spec as run records, step digests and evaluation cache keys hold it: its fields and
    the retired ones at their retired values (RETIRED_FIELDS)."""
    return {**RETIRED_FIELDS, **dataclasses.asdict(self)}

  @classmethod
  def from_record(cls, fields: dict) -> "DecodeSpec":
    """The spec of a recorded one (an export's metadata `decode`): the retired fields, which
    older exports still hold, are left out (they described OPD's rollouts, not a decode)."""
    return cls(**{k: v for k, v in fields.items() if k not in RETIRED_FIELDS})

  @property
  def order(self) -> commit.CommitOrder:
    """The commit order object of `commit_order` (checked when the spec was built)."""
    return commit.BY_NAME[self.commit_order]

  def draft(self, max_new_tokens: int) -> speculative.DraftDecoding:
    """The lossless mode's greedy settings for responses of up to max_new_tokens tokens (the one
    way a recipe's DraftDecoding is built)."""
    return speculative.DraftDecoding(max_new_tokens=max_new_tokens, k=self.draft_k,
                                     draft_tau=self.draft_tau, draft_steps=self.draft_steps,
                                     commit_order=self.order)
