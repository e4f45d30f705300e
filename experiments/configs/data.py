"""Data stage: raw Beauty -> split / retriever / candidate lists / teacher -> SIDs -> tokenizer ->
prompts -> TFDS, cached in the workdir (gr2jax/data/pipeline.py).

  python experiments/run.py --config=data.py --workdir=workdir
  python experiments/run.py --config=data.py:qwen3_8b --config.hf_dir=DIR --workdir=W

`get_data_config()` is the `data` field of every recipe (experiments/configs/recipe.py); the
qwen3 recipes change its prompt and extend the HF directory's tokenizer instead of training the
tiny BPE. `get_config(variant)` is the recipe's data stage.
"""

import os
import sys

import ml_collections

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # recipe.py, for get_config

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def get_data_config() -> ml_collections.ConfigDict:
  """The data settings (tiny CPU defaults; see the 8B notes per field)."""
  c = ml_collections.ConfigDict()
  c.data_dir = os.path.join(REPO_ROOT, "data", "amazon_beauty")  # items.jsonl.gz + sequences.txt.gz
  c.users = 0  # build on the first N users of sequences.txt only (0 = all 22,363; CI's
  #               HF-layout run: eval_subset_size must then be <= N)
  c.seed = 0  # seeds negatives, tie-breaking, embeddings, RQ-VAE and the BPE corpus sample
  c.max_history = 20  # history items kept per example (TIGER: 20)
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

  c.length_buckets = (96, 128, 192, 256, 320, 384, 448, 512)  # static sequence lengths of
  #                                 training batches (tiny default: <= 92 tokens -> 96)
  c.lambda_r = 0.5  # SFT loss weight of reasoning tokens (GR2: lambda_r < lambda_o)
  c.lambda_o = 1.0  # SFT loss weight of answer tokens
  return c


def get_config(variant: str = "") -> ml_collections.ConfigDict:
  from recipe import get_recipe  # recipe.py imports this module

  return get_recipe("data", variant)
