"""The named recipes: every setting of a reproduction, in one place (gr2jax/recipe.py types them).

A recipe is one ConfigDict; each config file is a view of it that names the stage to run:

  python experiments/run.py --config=table2.py --workdir=W                (tiny, every stage)
  python experiments/run.py --config=cft.py --workdir=W                   (tiny, the CFT stage)
  python experiments/run.py --config=table2.py:qwen3_8b --config.hf_dir=/models/Qwen3-8B \
      --workdir=W                                                         (the paper's scale)
  python experiments/run.py --config=table2.py:smoke --workdir=W          (tiny, a few steps)
  python experiments/run.py --config=table2.py:qwen3_0_6b,smoke --config.hf_dir=DIR ...

The variant is `RECIPE[,smoke]` (`smoke` alone = `tiny,smoke`): `smoke` cuts any recipe to a
handful of steps on a few hundred training and 32 evaluation users, and its teacher step to one
batch of 8 users (CI; minutes on 2 CPU cores). Override any field on the
command line: `--config.stages.cft.train.steps=100`, `--config.decode.eval_tau=0.9`,
`--config.data.prompt.history_items=10`; a misspelt field is an error.

Recipes: `tiny` (the CPU default: a from-scratch `tiny` model on the terse prompt) and
`qwen3_0_6b`, `qwen3_1_7b`, `qwen3_4b`, `qwen3_8b`, which start from a local HF Qwen3 directory
(`--config.hf_dir`; the model's dimensions come from its config.json) and use the paper's prompt.
The 8B hyper-parameters are the paper's (Diffusion-GR2, arXiv 2607.01170: CFT 3 epochs, OPD constant
lr 1e-6 at 128 prompts x 1.5k steps, RL G = 8, eps 0.2, alpha 0.2, 600 steps at lr 5e-7) or, where
the paper gives none (SFT, AR RL), ours; micro-batches and rollout chunks are the AOT plan's
(docs/plan_qwen3_8b.md, 8 x 80 GB). The smaller scales are scaled choices of ours, not from a
paper and not tuned: the 8B schedule and batches, learning rates raised as the model shrinks
(x2 at 4B, x3 at 1.7B, x5 at 0.6B) and micro-batches halved per halving of the model below 4B.
"""

import dataclasses
import functools
import os
from collections.abc import Callable

import ml_collections

from gr2jax import stage_registry
from gr2jax.decoding.spec import DecodeSpec

# The shipped raw data (data/amazon_beauty/ of the repository, next to the package).
DATA_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data",
                        "amazon_beauty")


def data_config() -> ml_collections.ConfigDict:
  """The data build's settings (tiny CPU defaults; the qwen3 recipes change the prompt)."""
  c = ml_collections.ConfigDict()
  c.data_dir = DATA_DIR  # items.jsonl.gz + sequences.txt.gz (the shipped Amazon Beauty copy)
  c.users = 0  # build on the first N users of sequences.txt only (0 = all 22,363; CI's
  #               HF-layout run: eval_subset_size must then be <= N)
  c.seed = 0  # seeds negatives, tie-breaking, embeddings, RQ-VAE and the BPE corpus sample
  c.max_history = 20  # history items kept per example (TIGER: 20)
  c.drop_unusable_users = False  # True drops (and counts in the summary's dataset row) the users
  #                                no example can be built for: fewer than 4 items (the split) or
  #                                fewer than num_candidates - 1 items they never touched (D's
  #                                negatives); False stops naming them by file, line and user id
  c.eval_subset_size = 1615  # Diffusion-GR2's test subset (split.eval_subset, seed 0)

  c.retriever = ml_collections.ConfigDict()
  c.retriever.window = 5  # max gap of a counted transition
  c.retriever.reverse = 0.3  # weight of backward transitions
  c.retriever.history = 20  # history items that score a user
  c.retriever.decay = 0.7  # recency decay per history step

  c.num_candidates = 10  # N, the length of D (target + N-1 negatives)
  c.negative_pool = "catalogue"  # 'catalogue' (all unseen items) or 'topk' (retriever top-K)
  c.pool_size = 3000  # K for negative_pool='topk'
  c.accept_position_leak = False  # True builds even with a late-position target spike

  c.all_training_targets = False  # True: one training example per training target, not per user
  #                                 (57k lists with rejection; tiny: R@1 on a par, slower build)
  c.evidence_decay = 0.8  # recency decay of the brand/leaf/path match levels
  c.evidence_window = 20  # history items the evidence looks at

  c.rejection = True  # keep only training examples whose teacher top-1 is the target (GR2);
  #                     False keeps all (tiny, terse prompt: R@1 floor +.000 off vs +.03 on;
  #                     docs/calibration_tiny_prompt.md)
  c.learned_headroom = True  # also fit a GBDT on validation lists: the headroom over the teacher
  #                             (headroom.py; printed for test and the 1,615 subset; 20-30 s on
  #                             2 busy cores, paid once per examples build since that is cached)
  c.teacher_traces = ""  # JSONL of LLM traces {"user", "reasoning", "ranking"}; '' = rule teacher
  c.strict_traces = True  # a bad trace row (corrupt JSON, unknown user, not a permutation...)
  #                         fails the build naming file:line; False skips it and prints the first
  #                         few as file:line: why, then their count

  c.embedding_dim = 256  # TF-IDF + SVD item embedding size
  c.item_embeddings = ""  # FILE.npy [12101, d] precomputed (e.g. Sentence-T5); '' = TF-IDF

  c.sids_file = ""  # FILE.npy int32 [12101, 4] precomputed SIDs (rqvae.save_sids); '' = train
  c.rqvae = ml_collections.ConfigDict()
  c.rqvae.latent_dim = 32  # code dimension (TIGER: 32)
  c.rqvae.num_levels = 3  # residual levels before the collision token
  c.rqvae.codebook_size = 256  # codes per level
  c.rqvae.beta = 0.25  # commitment weight
  c.rqvae.epochs = 100  # passes over the items (with Adam 3e-3: 12,101 unique SIDs, 1-2 min)
  c.rqvae.batch_size = 1024  # items per step
  c.rqvae.learning_rate = 3e-3  # Adam learning rate (TIGER's Adagrad 0.4 diverges on this budget)
  c.rqvae.kmeans_iters = 25  # Lloyd iterations of the k-means codebook initialisation
  c.rqvae.reset_every = 20  # epochs between dead-code resets (0 disables them)

  # Tiny default measured in docs/calibration_tiny_prompt.md: a terse prompt of slot + evidence
  # flags only (57 prompt / 29-35 response tokens) is what a from-scratch tiny model learns to
  # use in a CPU budget. The 8B/paper prompt: style 'chat', answer_format 'sid', evidence 'raw',
  # fields ('sid', 'brand', 'leaf', 'title'), history_items 20, max_citations 3.
  c.prompt = ml_collections.ConfigDict()
  c.prompt.style = "terse"  # 'terse' (tiny: chat markup + one line per item, no system turn,
  #                           headers or instruction; citations = slot + evidence token) or 'chat'
  c.prompt.answer_format = "slot"  # 'slot' (tiny) or 'sid' (8B; the paper's)
  c.prompt.evidence = "flags"  # 'flags' (tiny: per-candidate match buckets) or 'raw' (8B)
  c.prompt.fields = ()  # item fields shown (tiny: none, the flags carry the evidence); 8B: all 4
  c.prompt.title_words = 6  # title truncation (words) when 'title' is shown
  c.prompt.history_items = 0  # history items shown (tiny: none, flags summarise 20); 8B: 20
  c.prompt.max_citations = 2  # teacher citations rendered in the reasoning (8B: 3+)

  c.tokenizer_base = ""  # the HF tokenizer the build extends; set from the recipe's hf_dir
  #                         (--config.hf_dir), never here ('' = train the tiny BPE below)
  c.tokenizer_vocab_size = 3072  # total vocab of the tiny BPE incl. ~850 SID/slot/chat tokens
  c.tokenizer_sample = 4000  # train examples (4 prompt variants) in the BPE corpus / length stats

  c.lambda_r = 0.5  # SFT loss weight of reasoning tokens (GR2: lambda_r < lambda_o)
  c.lambda_o = 1.0  # SFT loss weight of answer tokens
  return c


HF_SCALES = {  # name: (learning-rate factor over 8B, micro-batch divisor vs 8B): scaled choices
  "qwen3_0_6b": (5.0, 4), "qwen3_1_7b": (3.0, 2), "qwen3_4b": (2.0, 1), "qwen3_8b": (1.0, 1)}


def _train(steps: int, batch_size: int, save_every: int) -> ml_collections.ConfigDict:
  t = ml_collections.ConfigDict()
  t.steps = steps  # optimiser steps (the run ends there; step-capped, not epochs)
  t.batch_size = batch_size  # rows per step (RL / OPD: prompts per step, each with G rollouts)
  t.micro_batches = 1  # gradient-accumulation micro-batches per step
  t.prepare_chunk = 0  # rows per rollout / prepare-forward call (teacher log-probs, pi_old) of
  #                      the RL / OPD stages (0 = all rows at once; else a multiple of the mesh's
  #                      batch shards, data x fsdp)
  t.seed = 0  # init, shuffling and per-step randomness (fold_in(key, step))
  t.save_every = save_every  # steps between run checkpoints
  t.keep = 3  # run checkpoints kept
  t.async_save = True  # orbax async checkpointing
  t.eval_every = 0  # steps between periodic evaluations (0 = only the final one)
  t.probe_prompts = 0  # validation prompts of the held-out probe: the stage's own objective
  #                      (its rollouts' reward / validity / forwards per token, its loss) at
  #                      step 0, every probe_every steps and the end (train/probe.py; 0 = off)
  t.probe_every = 0  # steps between probes (0 = the first and the last only)
  t.limit = 0  # use only the first N training examples (0 = all; smoke runs)
  t.restart = False  # True: move this stage's checkpoints + logs aside, start from init
  #                    (a resume refuses checkpoints written with other settings)
  return t


def _optimizer(train: ml_collections.ConfigDict, learning_rate: float, warmup_steps: int,
               constant: bool = False) -> ml_collections.ConfigDict:
  """AdamW; the on-policy stages (AR RL, OPD, RL) use a constant lr after a short warm-up and no
  weight decay (the paper: constant 1e-6 for OPD, 5e-7 for RL)."""
  o = ml_collections.ConfigDict()
  o.learning_rate = learning_rate  # peak learning rate
  o.warmup_steps = warmup_steps  # linear warm-up steps
  o.schedule = "constant" if constant else "cosine"  # 'cosine' (to end_lr_factor * lr)
  o.end_lr_factor = 0.1  # cosine floor as a fraction of the peak
  o.total_steps = train.get_ref("steps")  # schedule length
  o.b1 = 0.9
  o.b2 = 0.98
  o.eps = 1e-8
  o.weight_decay = 0.0 if constant else 0.01  # AdamW decay (never on norm scales)
  o.clip_norm = 1.0  # global-norm clipping (0 = off)
  return o


def _stage(steps: int, batch_size: int, save_every: int, learning_rate: float,
           warmup_steps: int, constant: bool = False, **blocks) -> ml_collections.ConfigDict:
  s = ml_collections.ConfigDict()
  s.train = _train(steps, batch_size, save_every)
  s.optimizer = _optimizer(s.train, learning_rate, warmup_steps, constant)
  for name, block in blocks.items():
    s[name] = ml_collections.ConfigDict(block)
  return s


# The training stages' values (gr2jax/stage_registry.py), one tiny-scale function and one HF-scale
# change per stage; the recipes build `stages` from STAGE_VALUES.


def _sft() -> ml_collections.ConfigDict:
  """SFT: ~38k examples (4 epochs of the 9,199 accepted traces), terse prompt."""
  return _stage(1200, 32, 200, 2e-3, 100)


def _sft_hf(s: ml_collections.ConfigDict, lr_factor: float, divisor: int) -> None:
  del divisor
  s.train.update(dict(steps=900, batch_size=32))  # ~3 epochs of 9.2k traces at batch 32
  s.optimizer.update(dict(learning_rate=1e-5 * lr_factor, warmup_steps=30))


def _ar_rl() -> ml_collections.ConfigDict:
  """AR RL (GR2 GRPO): 8 prompts x G rollouts per step."""
  return _stage(60, 8, 20, 1e-4, 5, constant=True, rl=dict(
    group_size=8,  # G rollouts per prompt (paper: 8)
    eps_low=0.2,  # ratio clip 1 - eps_low (paper: symmetric 0.2)
    eps_high=0.2,  # ratio clip 1 + eps_high (> eps_low = DAPO clip-higher)
    alpha=0.2,  # conditional format-reward weight (Diffusion-GR2 App. B)
    temperature=1.0,  # rollout sampling temperature (> 0; the log-probs use the same)
    valid_weight=0.0,  # advantage weight of R_valid, z-scored on its own (0 = GR2's reward alone)
    speed_weight=0.0))  # the same of R_speed, a valid rollout's tokens per forward (LightningRL;
  #                       one forward per token in AR RL: it never varies there)


def _ar_rl_hf(s: ml_collections.ConfigDict, lr_factor: float, divisor: int) -> None:
  s.train.update(dict(steps=600, batch_size=128, micro_batches=16 // divisor,
                      prepare_chunk=256))  # GR2 gives no count: the AOT plan's 600
  s.optimizer.learning_rate = 1e-6 * lr_factor


def _cft() -> ml_collections.ConfigDict:
  """CFT: 10 epochs of the 9,199 tiny traces at peak lr 4e-3 (valid on validation users at lr
  5e-4: .760 / .868 at 1.7 / 3 epochs; at 3 epochs .868 / .908 / .928 / .947 / .937 at lr
  5e-4 / 1e-3 / 2e-3 / 4e-3 / 8e-3; at lr 4e-3 .947 / .972 at 3 / 5 epochs, duplicates
  106 -> 55, docs/results/onpolicy_ablation.md; the 4-layer model's final export at 5 / 10
  epochs, first 2,000 validation users: valid .9825 / .994 at tau 1.0, .971 / .9845 at tau 0.9
  with the paper's commit rule, docs/results/table2.md)."""
  return _stage(5750, 16, 100, 4e-3, 30, cft=dict(
    eps=1e-3,  # per-block masking rate t ~ U(eps, 1)
    complementary=True,  # also train the inverted mask (every token supervised per pair)
    rate_power=2.0))  # masking-rate density ~ t^(p-1) (1 = U(eps, 1); 2 favours heavily
    #                   masked blocks: valid .696 -> .765 at tau 1.0 from one AR RL export,
    #                   docs/results/benchmarks/cft_validity/README.md (h))


def _cft_hf(s: ml_collections.ConfigDict, lr_factor: float, divisor: int) -> None:
  del divisor
  s.train.update(dict(steps=860, batch_size=32))  # paper: 3 epochs of 9.2k at batch 32
  s.optimizer.learning_rate = 1e-5 * lr_factor
  s.cft.rate_power = 1.0  # t ~ U(eps, 1), as proposed (Diffusion-GR2, arXiv 2607.01170, CFT):
  #                         the tiny model's p = 2 is a CPU measurement, untested at scale


def _opd() -> ml_collections.ConfigDict:
  """OPD: 20 x 8 prompts; lr 5e-5 for 40 steps lowered validity .70 -> .30; 5e-6: CFT valid
  .702 -> .733 in 20 steps (README); on validation users 5e-6 gains ~.02 in 100 steps while
  2e-5 collapses by 100 (.78 -> .51) (docs/results/onpolicy_ablation.md)."""
  s = _stage(20, 8, 20, 5e-6, 2, constant=True, opd=dict(
    group_size=4,  # G' student trajectories per prompt (paper: 4)
    rollout_tau=0.9,  # the student rollouts' commit threshold (paper: 0.9)
    temperature=1.0,  # the student rollouts' sampling temperature (> 0; the KL compares the
    #                   untempered policies, train/opd.py)
    context="commit_step",  # the student's context of token t: 'commit_step' (its decoding
    #                         canvas when t was committed) | 'left_clean' (the paper's (P, o_<t):
    #                         o_<t clean, the rest masked; B - 1 replay rounds); train/opd.py
    teacher_dtype="float32",  # storage of the cached teacher log-probs [B, M, V]: 'float32' |
    #                           'bfloat16' (half the memory; the loss reads f32)
    objective="kl",  # 'kl': the forward KL to AR GR2 on the student's rollouts (the paper's);
    #                  'self': CFT's loss on the model's own valid slow-decode answers
    #                  (train/self_distill.py; a latency lever, no teacher read)
    certainty=0.0))  # 'self': the certainty-forcing weight (dParallel: 2; 0 = off)
  s.train.micro_batches = 4  # rollout rows per micro-batch bound the replay's memory
  return s


def _opd_hf(s: ml_collections.ConfigDict, lr_factor: float, divisor: int) -> None:
  s.train.update(dict(steps=1500, batch_size=128, micro_batches=32 // divisor,
                      prepare_chunk=256))  # paper: 128 prompts x ~1.5k steps, 1 epoch
  s.optimizer.learning_rate = 1e-6 * lr_factor  # paper: constant 1e-6
  s.opd.teacher_dtype = "bfloat16"  # f32: [512, 256, 151,936] = 80 GB per step (the plan)


def _rl() -> ml_collections.ConfigDict:
  """Diffusion RL (TraceRL-style GRPO): 4 prompts x G per step; after the 3-epoch CFT and OPD,
  valid on validation users .863 -> .866 / .876 / .875 at 60 / 120 / 180 steps: it stops
  improving by 120; after the 5-epoch CFT, rollout temperatures 0.25-1, rollout taus 0.5-0.9
  and 32 prompts per step all leave tau-0.9 validity within one standard error of CFT's
  (docs/results/onpolicy_ablation.md)."""
  s = _stage(120, 4, 20, 2e-5, 2, constant=True, rl=dict(
    group_size=8, eps_low=0.2, eps_high=0.2, alpha=0.2,  # as AR RL (paper: G 8, eps 0.2)
    temperature=1.0,
    rollout_tau=0.9,  # the rollouts' commit threshold (paper: 0.9)
    valid_weight=0.0, speed_weight=0.0))  # the fast-decode rewards' weights, as AR RL's
  s.train.micro_batches = 4
  return s


def _rl_hf(s: ml_collections.ConfigDict, lr_factor: float, divisor: int) -> None:
  s.train.update(dict(steps=600, batch_size=128, micro_batches=64 // divisor,
                      prepare_chunk=256))  # paper: 600 steps
  s.optimizer.learning_rate = 5e-7 * lr_factor  # paper: 5e-7


@dataclasses.dataclass(frozen=True)
class StageValues:
  """A training stage's values per scale.

  Attributes:
    tiny: () -> its block at the tiny scale (train, optimizer, its own settings).
    hf: (block, learning-rate factor over 8B, micro-batch divisor vs 8B) -> None: the block
      changed in place to an HF scale (HF_SCALES).
    smoke_rows: a stage with a rows field (gr2jax/stage_registry.py): that field's value in a
      smoke run, which trains 2 prompts per step.
  """
  tiny: Callable[[], ml_collections.ConfigDict]
  hf: Callable[[ml_collections.ConfigDict, float, int], None]
  smoke_rows: int | None = None


# 8 rollout rows per on-policy step in a smoke run (AR RL, RL: 2 prompts x 4; OPD: 2 x 2): at 4 x G
# these steps were most of an HF recipe's smoke (bf16 on CPU, ~1,000-token rows)
STAGE_VALUES = {
  "sft": StageValues(_sft, _sft_hf),
  "ar_rl": StageValues(_ar_rl, _ar_rl_hf, smoke_rows=4),
  "cft": StageValues(_cft, _cft_hf),
  "opd": StageValues(_opd, _opd_hf, smoke_rows=2),
  "rl": StageValues(_rl, _rl_hf, smoke_rows=4),
}


def _tiny() -> ml_collections.ConfigDict:
  """The tiny CPU recipe (docs/calibration_tiny_prompt.md; README Table 2: 43 min on 2 cores)."""
  c = ml_collections.ConfigDict()
  c.recipe = "tiny"  # the recipe's name
  c.hf_dir = ""  # a local HF Qwen3 directory to start from ('' = model.preset from scratch)
  c.upstream = "check"  # a stage whose upstream stages are not done: 'check' names them and the
  #                       commands that make them, 'run' runs them first
  c.data = data_config()  # the data build every stage trains and evaluates on
  c.model = ml_collections.ConfigDict()
  c.model.preset = "tiny_deep"  # gr2jax ModelConfig preset sized to the tokenizer ('' =
  #   hf_dir); 4 layers: after the whole chain, valid on validation users at tau 0.9 .971 against
  #   .952 with the 2-layer `tiny` (docs/results/onpolicy_ablation.md "A deeper tiny model")
  c.model.remat = "none"  # 'none' | 'full' (recompute each layer in the backward pass)
  c.model.attention_chunk_bytes = 8 << 20  # f32 attention scores per query chunk (8 MiB: CPU)
  c.model.param_dtype = ""  # '' keeps the checkpoint's dtype; 'bfloat16' (fp32 moments) / 'float32'
  # the one decode spec: its fields, defaults (the paper's) and meaning are DecodeSpec's
  # (gr2jax/decoding/spec.py): block_size, eval_tau, max_steps_per_block, constrained,
  # commit_order, the lossless draft (the on-policy stages' rollouts: their own settings)
  c.decode = ml_collections.ConfigDict(dataclasses.asdict(DecodeSpec()))
  c.decode.commit_order = "distinct"  # the tiny model commits a token new to the block at one
  #   place per step (gr2jax/diffusion/commit.py): tau-0.9 validity +.0065 on validation users
  #   for 4% more forwards per token; the paper's rule ('confidence') at the HF scales
  c.replay_shrink = 1  # OPD / RL replay step shrinkage (1 = exact; k merges k steps per round)
  c.xla_flags = ()  # XLA flags every compile of the run needs ('--xla_<name>=<value>'):
  #                   experiments/run.py merges them into XLA_FLAGS before JAX starts its backend
  #                   (an XLA_FLAGS entry with another value is an error), plan.py --target
  #                   compiles with them (a platform's own xla_gpu_* / xla_tpu_* on that one only)
  c.mesh = ml_collections.ConfigDict()
  c.mesh.data = 1  # data-parallel replicas
  c.mesh.fsdp = -1  # parameter-sharded data parallelism (-1 = the remaining devices)
  c.mesh.tp = 1  # tensor parallelism
  c.eval = ml_collections.ConfigDict()
  c.eval.split = "test_1615"  # 'test_1615' (the paper's 1,615 users) | 'test' | 'validation'
  c.eval.limit = 0  # evaluate only the first N examples (0 = all)
  c.eval.batch_size = 256  # decode batch size
  c.table = ml_collections.ConfigDict()
  c.table.splits = ("test_1615", "test")  # Table 2's splits (the paper's 1,615 users, all users)
  c.table.diffusion_splits = ("test_1615",)  # of those, where the diffusion rows are evaluated
  #   too: at tau = 1.0 a row on all 22,363 users takes 13 min on 2 quiet CPU cores (one token
  #   per 32-token block forward; the naive row ~1.4x that), over an hour for the five rows
  c.table.results_dir = os.path.join("{workdir}", "results")  # table2.{md,csv,json}, ...
  c.table.then = ("table3", "table4", "fig6")  # tables run after Table 2 by table2.py
  c.table.split = "test_1615"  # the split of Table 3, Table 4 and Figure 6
  c.table.taus = (1.0, 0.9, 0.8, 0.6, 0.4)  # Table 3's diffusion commit thresholds (the
  #                                          paper's Table 3: 0.9, 0.6, 0.4; 1.0 = Table 2's)
  c.table.speed_examples = 100  # Table 3: examples decoded alone for batch-1 tokens/s (0 = skip)
  c.table.lossless_drafts = ((16, 0.0), (8, 0.9))  # Table 3's lossless rows, (K, tau_d) each
  #   (the final diffusion model drafts, AR GR2 verifies; Figure 6 times decode.draft_k / tau)
  c.table.remeasure = False  # True: time Table 3's batch-1 decodes and Figure 6 again; else a
  #                            finished table's timings of the same models and settings are reused
  c.table.fig6 = ml_collections.ConfigDict()
  c.table.fig6.tau = 0.9  # diffusion commit threshold of the timed decodes
  c.table.fig6.limit = 300  # examples decoded one by one by each model (0 = the whole split)
  c.table.fig6.num_bins = 6  # quantile bins of output / prompt length
  c.table.fig6.output_lengths = (32, 64, 128, 256)  # forced output lengths of the sweep
  c.table.fig6.sweep_examples = 20  # examples decoded (batch 1) at each forced length per model

  c.teacher = ml_collections.ConfigDict()  # the LLM-teacher step (gr2jax/data/llm_teacher.py):
  t = c.teacher  # its traces become the data build's data.teacher_traces; tiny: a model trained
  #                here (e.g. W0/sft/export) on the build's own prompt; the mesh is the recipe's
  t.hf_dir = ""  # the teacher: a local HF Qwen3 dir or a gr2jax checkpoint ('' = rule teacher)
  t.tokenizer_dir = ""  # '' = hf_dir's own tokenizer, else the data build's (a model trained here)
  t.prompt = "data"  # 'chat' (GR2's rejection prompt, the tokenizer's chat template, thinking
  #                    off) or 'data' (the data build's own prompt, as a model trained here reads)
  t.attempts = 4  # k, the most samples per user (rejection sampling; the paper gives none)
  t.temperature = 1.0  # sampling temperature (0 = greedy, then attempts must be 1)
  t.top_p = 1.0  # nucleus sampling mass (1 = off)
  t.max_new_tokens = 48  # response cap per attempt (tiny: the longest training response, 36,
  #                        rounded up; GR2: ~130 reasoning tokens + 10 labels)
  t.batch_size = 128  # rows per generate call (static; a multiple of the mesh's batch shards)
  t.num_users = 1000  # training users answered (0 = all), a seeded sample (a larger one extends it)
  t.seed = 0  # user sample and sampling keys (batch b: fold_in(key(seed), b))
  t.param_dtype = "auto"  # 'auto' (bf16 on accelerators, the checkpoint's dtype on CPU),
  #                         'float32' or 'bfloat16'
  t.restart = False  # True: a previous output made with other settings is moved aside
  #                    (W/teacher.<its digest>, kept) and sampling starts again; without it such
  #                    a rerun is refused, naming the changed fields (num_users may change: a
  #                    larger sample extends the first one)

  c.stages = ml_collections.ConfigDict()
  for name in stage_registry.names():
    c.stages[name] = STAGE_VALUES[name].tiny()
  return c


def _qwen3(c: ml_collections.ConfigDict, name: str) -> None:
  """An HF scale (module docstring for the sources): the paper's prompt, bf16, remat."""
  lr_factor, divisor = HF_SCALES[name]
  c.model.preset = ""  # the model is --config.hf_dir's
  c.decode.commit_order = DecodeSpec().commit_order  # the paper's commit rule
  c.model.remat = "full"
  c.model.param_dtype = "bfloat16"
  c.model.attention_chunk_bytes = 1 << 30  # accelerator-sized attention chunks
  # cuBLAS gemms, not Triton: XLA's H100 compiler (deviceless, default Triton tiles without
  # autotuning) found no tiles for the train steps' dots: "INTERNAL: Couldn't find output tile
  # sizes that satisfy hlo: %dot.721 = bf16[9824,4096]" (8B SFT, fsdp 8) and bf16[20784,1024]
  # (0.6B OPD, one chip); with this flag every 8B / 0.6B program compiled (docs/plan_qwen3_8b.md
  # "On the real compilers"). XLA parses it on every platform; only GPU compiles read it.
  c.xla_flags = ("--xla_gpu_enable_triton_gemm=false",)
  p = c.data.prompt  # the paper's prompt (GR2, arXiv 2602.07774)
  p.style = "chat"
  p.answer_format = "sid"
  p.evidence = "raw"
  p.fields = ("sid", "brand", "leaf", "title")
  p.history_items = 20
  p.max_citations = 3
  c.table.diffusion_splits = ("test_1615", "test")
  t = c.teacher  # the paper's teacher (Qwen3-32B, --config.teacher.hf_dir), GR2's prompt
  t.update(dict(prompt="chat", temperature=0.7, top_p=0.95, max_new_tokens=512, batch_size=64,
                num_users=0))
  for stage in stage_registry.names():
    STAGE_VALUES[stage].hf(c.stages[stage], lr_factor, divisor)

def _smoke(c: ml_collections.ConfigDict) -> None:
  """Every stage, the teacher step and every row on a few examples with a handful of steps
  (CI)."""
  c.data.learned_headroom = False
  c.data.rqvae.epochs = 10
  c.table.splits = ("test_1615",)
  c.table.diffusion_splits = ("test_1615",)
  c.eval.limit = 32
  c.eval.batch_size = 16  # two batches of the 32 users: Table 3's tokens/s is timed after the first
  c.decode.max_steps_per_block = 4  # untrained models commit ~1 token per step
  c.table.speed_examples = 4
  c.table.fig6.limit = 8
  c.table.fig6.output_lengths = (16,)  # each forced length compiles two decoders
  c.table.fig6.sweep_examples = 2
  c.table.lossless_drafts = ((c.decode.draft_k, c.decode.draft_tau),)  # one lossless program
  for name, stage in stage_registry.STAGES.items():
    t = c.stages[name].train
    t.update(dict(steps=2, batch_size=4, limit=256, save_every=2, prepare_chunk=0,
                  micro_batches=min(t.micro_batches, 4)))
    if stage.rows_field is not None:  # 2 prompts x STAGE_VALUES' smoke_rows
      t.batch_size = 2
      c.stages[name][stage.block][stage.rows_field] = STAGE_VALUES[name].smoke_rows
  # the teacher step: one batch of 8 users, 2 attempts each (all users: ~1.4 s a user on 2 CPU
  # cores with an HF recipe's 512-token responses, ~9 h)
  t = c.teacher
  t.update(dict(num_users=8, batch_size=8, attempts=min(t.attempts, 2),
                max_new_tokens=min(t.max_new_tokens, 128)))


def _evaluate_block() -> ml_collections.ConfigDict:
  """`--config=eval.py`'s block: which checkpoint to evaluate (experiments/configs/eval.py)."""
  e = ml_collections.ConfigDict()
  e.ckpt = ""  # the checkpoint to evaluate (a gr2jax export or an HF directory)
  e.out_dir = ""  # where results go ('' = next to the checkpoint)
  e.convert = False  # convert an AR checkpoint to block diffusion (B = decode.block_size)
  return e


def _rerank_block() -> ml_collections.ConfigDict:
  """`--config=rerank.py`'s block: the offline re-ranking tool (gr2jax/apps/rerank.py)."""
  r = ml_collections.ConfigDict()
  r.ckpt = os.path.join("{workdir}", "rl", "export")  # the model export (AR or diffusion)
  r.requests = ""  # JSONL of requests (required)
  r.out = ""  # output JSONL ('' = <requests>.ranked.jsonl)
  r.items_file = ""  # a user-supplied items.jsonl ('' = the data build's catalogue)
  r.batch_size = 64  # decode batch size (one compiled shape)
  r.max_new_tokens = 0  # response cap (0 = the build's response length R)
  r.verify_with = ""  # an AR export verifying ckpt's drafts, e.g. '{workdir}/ar_rl/export': the
  #                     lossless mode (AR GR2's own answers; '' = ckpt's own decoder)
  return r


def _serve_block() -> ml_collections.ConfigDict:
  """`--config=serve.py`'s block: the re-ranking server (gr2jax/apps/serve/; spec.py types and
  checks it as one ServeSpec)."""
  s = ml_collections.ConfigDict()
  s.ckpt = os.path.join("{workdir}", "rl", "export")  # the model export (AR or diffusion)
  s.host = "127.0.0.1"  # address to listen on (loopback; a replica behind a balancer: 0.0.0.0)
  s.port = 8000  # TCP port (0 = a free port, printed at start)
  s.batch_buckets = (1, 2, 4, 8, 16, 32, 64)  # compiled batch sizes; a batch decodes in the
  #                                             smallest that holds it, padded with repeated rows
  s.prompt_lengths = ()  # compiled prompt widths (() = the data build's P, data/lengths.py)
  s.window_ms = 5.0  # how long the oldest queued request waits for others to share its batch
  s.queue_bound = 256  # admitted requests not yet answered; beyond it: 503 + Retry-After
  s.timeout_s = 30.0  # a request not answered this long after admission gets a 504
  s.retry_after_s = 1  # the Retry-After of a 503 (seconds)
  s.max_body_bytes = 1 << 20  # larger request bodies get a 413
  s.drain_timeout_s = 60.0  # SIGTERM: the longest wait for admitted requests before exiting
  s.keep_alive_s = 75.0  # idle keep-alive connections are closed after this (above a load
  #                        balancer's idle timeout, often 60 s, so it never reuses a closing one)
  s.items_file = ""  # a user-supplied items.jsonl ('' = the data build's catalogue)
  s.max_new_tokens = 0  # response cap (0 = the build's response length R)
  s.verify_with = ""  # an AR export verifying ckpt's drafts (the lossless mode; '' = off)
  s.mode = "fixed"  # 'fixed': ckpt's own decoder (with verify_with: draft-and-verify at
  #                   decode.draft_k); 'auto' (needs verify_with): per batch bucket the fastest
  #                   of the verifier alone and draft-and-verify at each draft_ks, all writing
  #                   the verifier's answers (gr2jax/apps/serve/auto.py)
  s.draft_ks = (4, 8, 16)  # 'auto': the K's of draft-and-verify it chooses among
  s.cost_table = ""  # 'auto': a JSON file {bucket: {decoder: seconds per batch}} to choose
  #                    from ('' = each bucket's programs timed at warm-up)
  s.model_name = ""  # the answers' "model" ('' = <stage>-step<step> from the export's metadata)
  s.compilation_cache = os.path.join("{workdir}", "serve", "jax_cache")  # JAX's persistent
  #                                                       compilation cache ('' = off)
  return s


def _tiny_as_is(c: ml_collections.ConfigDict) -> None:
  """The tiny recipe: `_tiny()` unchanged."""
  del c


# The named recipes: name -> a function that turns the tiny recipe's ConfigDict (`_tiny()`) into
# this recipe in place. A new recipe is a function here (README.md, "How to extend").
RECIPES = {"tiny": _tiny_as_is,
           **{name: functools.partial(_qwen3, name=name) for name in HF_SCALES}}

_BLOCKS = {"eval": ("evaluate", _evaluate_block), "rerank": ("rerank", _rerank_block),
           "serve": ("serve", _serve_block)}


def parse_variant(variant: str) -> tuple[str, bool]:
  """(recipe name, smoke) of a variant `RECIPE[,smoke]` ('' = tiny; 'smoke' = tiny,smoke).

  Raises:
    ValueError: an unknown recipe name.
  """
  parts = [p for p in variant.split(",") if p] if variant else []
  smoke = "smoke" in parts
  names = [p for p in parts if p != "smoke"] or ["tiny"]
  if len(names) != 1 or names[0] not in RECIPES:
    raise ValueError(f"unknown variant {variant!r}; expected RECIPE[,smoke] with RECIPE in "
                     f"{list(RECIPES)}, or 'smoke'")
  return names[0], smoke


def config(variant: str = "", stage: str = "table2") -> ml_collections.ConfigDict:
  """The recipe `variant` (`RECIPE[,smoke]`, '' = tiny) as the ConfigDict of `stage`.

  What every config file of experiments/configs/ returns (stage.py for each training stage);
  the command line overrides its fields.

  Args:
    variant: the recipe name, optionally followed by ',smoke'.
    stage: what experiments/run.py runs (its STAGES key); eval, rerank and serve add their
      block.

  Raises:
    ValueError: an unknown recipe name.
  """
  name, smoke = parse_variant(variant)
  c = _tiny()
  RECIPES[name](c)
  c.recipe = name
  if smoke:
    _smoke(c)
  c.stage = stage  # experiments/run.py STAGES key: what this config runs
  if stage in _BLOCKS:
    field, block = _BLOCKS[stage]
    c[field] = block()
  return c


def get(variant: str = "tiny", *, hf_dir: str = ""):
  """The typed recipe (gr2jax.recipe.Recipe) of `variant`, for use from Python.

    recipe = gr2jax.recipes.get("tiny")
    recipe = gr2jax.recipes.get("qwen3_8b", hf_dir="/models/Qwen3-8B")

  Args:
    variant: `RECIPE[,smoke]`.
    hf_dir: the local HF Qwen3 directory of a qwen3_* recipe.
  """
  from gr2jax import recipe

  c = config(variant)
  c.hf_dir = hf_dir
  return recipe.from_config(c)
