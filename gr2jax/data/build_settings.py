"""The data build's and the LLM teacher's settings, declared on the one schema (gr2jax/settings.py).

  DataSettings      a recipe's `data` block: what the data build (data/pipeline.py) makes, with
                    its nested blocks `retriever` (RetrieverSettings), `rqvae` (RQVAESettings)
                    and `prompt` (data/prompts.PromptSettings)
  TeacherSettings   a recipe's `teacher` block: the LLM-teacher step (data/llm_teacher.py, whose
                    TeacherSpec adds the recipe's mesh)

Each field carries its default (the tiny recipe's value), a one-line doc and its bounds; a bad
value is a ValueError naming its path (`data.rqvae.epochs=0 must be >= 1`). A block's `to_dict()`
is the dict its ConfigDict gave, so the data build's cache keys and the records stay the same.

This module is light (no JAX, TensorFlow or scikit-learn): the recipes and the command line read
it; the heavy modules that run a block (retriever.py, rqvae.py, llm_teacher.py) import their
block from here.
"""

import dataclasses
import os

from gr2jax import settings
from gr2jax.data import prompts

# The shipped raw data (data/amazon_beauty/ of the checkout, next to the package).
DATA_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
  os.path.abspath(__file__)))), "data", "amazon_beauty")
POOLS = ("catalogue", "topk")  # where a list's negatives come from (data/candidates.py)
PROMPT_FORMATS = ("chat", "data")  # the LLM teacher's prompts (data/llm_teacher.py)
PARAM_DTYPES = ("auto", "float32", "bfloat16")  # the LLM teacher's parameter dtypes


@dataclasses.dataclass(frozen=True, kw_only=True)
class RetrieverSettings(settings.Settings):
  """The co-occurrence + recency retriever (data/retriever.py; defaults: the measured ones)."""

  WHERE = "data.retriever."

  window: int = settings.integer(5, doc="max gap of a counted transition", minimum=1)
  reverse: float = settings.real(0.3, doc="weight of backward transitions", low=0.0)
  history: int = settings.integer(20, doc="history items that score a user", minimum=1)
  decay: float = settings.real(0.7, doc="recency decay per history step", low=0.0, high=1.0)


@dataclasses.dataclass(frozen=True, kw_only=True)
class RQVAESettings(settings.Settings):
  """The RQ-VAE of the semantic IDs: the settings a recipe chooses (data/rqvae.RQVAEConfig adds
  the architecture the recipes leave at TIGER's)."""

  WHERE = "data.rqvae."

  latent_dim: int = settings.integer(32, doc="code dimension (TIGER: 32)", minimum=1)
  num_levels: int = settings.integer(3, doc="residual levels before the collision token",
                                     minimum=1)
  codebook_size: int = settings.integer(256, doc="codes per level", minimum=1)
  beta: float = settings.real(0.25, doc="commitment weight", low=0.0)
  epochs: int = settings.integer(100, doc="passes over the items (with Adam 3e-3: 12,101 unique "
                                 "SIDs, 1-2 min)", minimum=1)
  batch_size: int = settings.integer(1024, doc="items per step", minimum=1)
  learning_rate: float = settings.real(3e-3, doc="Adam learning rate (TIGER's Adagrad 0.4 "
                                       "diverges on this budget)", low=0.0, low_open=True)
  kmeans_iters: int = settings.integer(25, doc="Lloyd iterations of the k-means codebook "
                                       "initialisation", minimum=0)
  reset_every: int = settings.integer(20, doc="epochs between dead-code resets (0 disables "
                                      "them)", minimum=0)


@dataclasses.dataclass(frozen=True, kw_only=True)
class DataSettings(settings.Settings):
  """The data build (data/pipeline.py): raw Beauty -> examples -> SIDs -> tokenizer -> prompts.

  Tiny CPU defaults; the qwen3 recipes change the prompt (gr2jax/recipes.py).
  """

  WHERE = "data."

  data_dir: str = settings.text(DATA_DIR, doc="items.jsonl.gz + sequences.txt.gz (the shipped "
                                "Amazon Beauty copy)", nonempty="a directory")
  users: int = settings.integer(0, doc="build on the first N users of sequences.txt only (0 = "
                                "all 22,363; eval_subset_size must then be <= N)", minimum=0)
  seed: int = settings.integer(0, doc="seeds negatives, tie-breaking, embeddings, RQ-VAE and "
                               "the BPE corpus sample", minimum=0)
  max_history: int = settings.integer(20, doc="history items kept per example (TIGER: 20)",
                                      minimum=1)
  drop_unusable_users: bool = settings.flag(
    False, doc="drop (and count in the summary) the users no example can be built for; False "
    "stops naming them by file, line and user id")
  eval_subset_size: int = settings.integer(1615, doc="Diffusion-GR2's test subset "
                                           "(split.eval_subset, seed 0)", minimum=1)
  retriever: RetrieverSettings = settings.block(
    RetrieverSettings, doc="the retriever that orders D and scores the floor")
  num_candidates: int = settings.integer(10, doc="N, the length of D (target + N-1 negatives)",
                                         minimum=2)
  negative_pool: str = settings.choice("catalogue", doc="'catalogue' (all unseen items) or "
                                       "'topk' (retriever top-K)", choices=POOLS)
  pool_size: int = settings.integer(3000, doc="K for negative_pool='topk' (>= N-1)", minimum=1)
  accept_position_leak: bool = settings.flag(False, doc="build even with a late-position "
                                             "target spike")
  all_training_targets: bool = settings.flag(False, doc="one training example per training "
                                             "target, not per user")
  evidence_decay: float = settings.real(0.8, doc="recency decay of the brand/leaf/path match "
                                        "levels", low=0.0, high=1.0)
  evidence_window: int = settings.integer(20, doc="history items the evidence looks at",
                                          minimum=1)
  rejection: bool = settings.flag(True, doc="keep only training examples whose teacher top-1 "
                                  "is the target (GR2); False keeps all")
  learned_headroom: bool = settings.flag(True, doc="also fit a GBDT on validation lists: the "
                                         "headroom over the teacher (headroom.py)")
  teacher_traces: str = settings.text("", doc="JSONL of LLM traces {user, reasoning, ranking} "
                                      "('' = rule teacher)")
  strict_traces: bool = settings.flag(True, doc="a bad trace row fails the build naming "
                                      "file:line; False skips it and counts it")
  embedding_dim: int = settings.integer(256, doc="TF-IDF + SVD item embedding size", minimum=1)
  item_embeddings: str = settings.text("", doc="FILE.npy [I, d] precomputed (e.g. Sentence-T5; "
                                       "'' = TF-IDF)")
  sids_file: str = settings.text("", doc="FILE.npy int32 [I, 4] precomputed SIDs "
                                 "(rqvae.save_sids; '' = train the RQ-VAE)")
  rqvae: RQVAESettings = settings.block(RQVAESettings, doc="the RQ-VAE of the semantic IDs")
  prompt: prompts.PromptSettings = settings.block(prompts.PromptSettings,
                                                  doc="how an example is shown to the model")
  tokenizer_base: str = settings.text("", doc="the HF tokenizer the build extends; set from "
                                      "the recipe's hf_dir ('' = train the tiny BPE)")
  tokenizer_vocab_size: int = settings.integer(3072, doc="total vocab of the tiny BPE incl. "
                                               "~850 SID/slot/chat tokens", minimum=1)
  tokenizer_sample: int = settings.integer(4000, doc="train examples (4 prompt variants) in the "
                                           "BPE corpus / length stats", minimum=1)
  lambda_r: float = settings.real(0.5, doc="SFT loss weight of reasoning tokens (GR2: lambda_r "
                                  "< lambda_o)", low=0.0)
  lambda_o: float = settings.real(1.0, doc="SFT loss weight of answer tokens", low=0.0)

  def check(self, where: str) -> None:
    """The 'topk' pool must hold the N-1 negatives."""
    if self.negative_pool == "topk" and self.pool_size < self.num_candidates - 1:
      raise ValueError(f"{settings.label(where, 'pool_size')}={self.pool_size} must be >= "
                       f"{settings.label(where, 'num_candidates')} - 1 = "
                       f"{self.num_candidates - 1} with negative_pool='topk'")


def data_settings(config) -> DataSettings:
  """The DataSettings of a data build's settings: `config` itself, or those of a ConfigDict or
  mapping of its fields (a recipe's `data` block, an export's recorded data_config), checked,
  errors naming `data.<field>`."""
  if isinstance(config, DataSettings):
    return config
  values = config.to_dict() if hasattr(config, "to_dict") else config
  return DataSettings.of(values, DataSettings.WHERE)


@dataclasses.dataclass(frozen=True, kw_only=True)
class TeacherSettings(settings.Settings):
  """The LLM-teacher step (data/llm_teacher.py): its traces become the data build's
  data.teacher_traces; tiny: a model trained here on the build's own prompt."""

  WHERE = "teacher."

  hf_dir: str = settings.text("", doc="the teacher: a local HF Qwen3 dir or a gr2jax checkpoint "
                              "('' = rule teacher)")
  tokenizer_dir: str = settings.text("", doc="'' = hf_dir's own tokenizer, else the data "
                                     "build's (a model trained here)")
  prompt: str = settings.choice("data", doc="'chat' (GR2's rejection prompt, chat template, "
                                "thinking off) or 'data' (the data build's own prompt)",
                                choices=PROMPT_FORMATS)
  attempts: int = settings.integer(4, doc="k, the most samples per user (rejection sampling)",
                                   minimum=1)
  temperature: float = settings.real(1.0, doc="sampling temperature (0 = greedy, then attempts "
                                     "must be 1)", low=0.0)
  top_p: float = settings.real(1.0, doc="nucleus sampling mass (1 = off)", low=0.0, high=1.0,
                               low_open=True)
  max_new_tokens: int = settings.integer(48, doc="response cap per attempt (tiny: the longest "
                                         "training response rounded up)", minimum=1)
  batch_size: int = settings.integer(128, doc="rows per generate call (a multiple of the mesh's "
                                     "batch shards)", minimum=1)
  num_users: int = settings.integer(1000, doc="training users answered (0 = all), a seeded "
                                    "sample (a larger one extends it)", minimum=0)
  seed: int = settings.integer(0, doc="user sample and sampling keys (batch b: "
                               "fold_in(key(seed), b))", minimum=0)
  param_dtype: str = settings.choice("auto", doc="'auto' (bf16 on accelerators, the "
                                     "checkpoint's dtype on CPU), 'float32' or 'bfloat16'",
                                     choices=PARAM_DTYPES)
  restart: bool = settings.flag(False, doc="move a previous output made with other settings "
                                "aside (W/teacher.<its digest>) and sample again; else such a "
                                "rerun is refused")

  def check(self, where: str) -> None:
    """Greedy decoding (temperature 0) repeats its first answer: one attempt only."""
    if self.temperature == 0 and self.attempts > 1:
      raise ValueError(f"{settings.label(where, 'attempts')}={self.attempts} with temperature 0: "
                       "greedy decoding repeats its first answer; set attempts=1 or a "
                       "temperature > 0")
