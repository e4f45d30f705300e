"""RQ-VAE semantic IDs (TIGER; TIGER, Rajput et al., NeurIPS 2023), in Flax + optax.

Design (TIGER): an MLP encoder in -> 512 -> 256 -> 128 -> 32 (ReLU between layers), L=3 levels of
residual quantisation with K=256 codes of dim 32, a mirrored decoder, and the loss

  ||x - x_hat||^2 + sum_l (||sg[r_l] - e_l||^2 + beta ||r_l - sg[e_l]||^2),   beta = 0.25,

where r_0 = z = enc(x), e_l is the code of r_l nearest in level l's codebook, r_{l+1} = r_l - e_l,
and the decoder reads z + sg[sum_l e_l - z] (straight-through estimator). Each level's codebook is
k-means initialised on the (residual) latents of all items; codes unused over the whole catalogue
are periodically reset to random residuals of that level (dead-code handling) during the first
`reset_fraction` of training. A 4th token enumerates items that share all 3 codes, in item-index
order, so every item's 4-token SID is unique.

Params pytree: {'encoder': linen Dense params, 'decoder': linen Dense params,
'codebooks': [L, K, d]}. Training is a jitted pure function of (params, opt_state, data, key).
"""

import dataclasses
import functools
import pathlib
import time
from typing import TYPE_CHECKING

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from gr2jax import settings
from gr2jax.data import build_settings
from gr2jax.progress import progress

if TYPE_CHECKING:
  import optax

MAX_COLLISIONS = 256  # size cap of the 4th (collision) vocabulary
OPTIMIZERS = ("adam", "adagrad")


@dataclasses.dataclass(frozen=True, kw_only=True)
class RQVAEConfig(build_settings.RQVAESettings):
  """RQ-VAE architecture and training settings: a recipe's `data.rqvae` block (RQVAESettings)
  and the architecture the recipes leave at TIGER's design (defaults sized for 2 CPU cores).

  TIGER trains 20k epochs with Adagrad lr 0.4; in a 100-epoch CPU budget that diverges on Beauty,
  and Adam at 1e-2 collapses the codebooks, so the default is Adam 3e-3 (measured on the shipped
  catalogue with TF-IDF embeddings: utilisation >= 99.6% per level, ~13% collisions; 150 epochs
  gave no gain). Hashable: the config is a jit static argument.
  """

  hidden: tuple[int, ...] = settings.ints((512, 256, 128), doc="encoder hidden widths (the "
                                          "decoder mirrors them)", minimum=1)
  optimizer: str = settings.choice("adam", doc="'adam' or 'adagrad' (TIGER: adagrad, lr 0.4)",
                                   choices=OPTIMIZERS)
  reset_fraction: float = settings.real(0.7, doc="dead-code resets happen only during this "
                                        "leading fraction of the epochs, so the codes settle "
                                        "before the end", low=0.0, high=1.0)


class MLP(nn.Module):
  """Dense layers with ReLU between them (none after the last)."""

  features: tuple[int, ...]

  @nn.compact
  def __call__(self, x):  # [B, in] -> [B, features[-1]]
    for i, width in enumerate(self.features):
      x = nn.Dense(width, name=f"dense_{i}")(x)
      if i < len(self.features) - 1:
        x = nn.relu(x)
    return x


def _encoder(config: RQVAEConfig) -> MLP:
  return MLP((*config.hidden, config.latent_dim))


def _decoder(config: RQVAEConfig, input_dim: int) -> MLP:
  return MLP((*reversed(config.hidden), input_dim))


def _input_dim(params) -> int:
  """The embedding dimension the params were built for (the decoder's output width)."""
  last = params["decoder"][f"dense_{len(params['decoder']) - 1}"]
  return last["bias"].shape[0]


def init_params(key: jax.Array, config: RQVAEConfig, input_dim: int) -> dict:
  """Random encoder / decoder params and zero codebooks (filled by `kmeans_init_codebooks`).

  Args:
    key: PRNG key.
    config: the RQ-VAE config.
    input_dim: embedding dimension.

  Returns:
    {'encoder', 'decoder', 'codebooks': [L, K, d] zeros}.
  """
  k_enc, k_dec = jax.random.split(key)
  enc = _encoder(config).init(k_enc, jnp.zeros((1, input_dim)))["params"]
  dec = _decoder(config, input_dim).init(k_dec, jnp.zeros((1, config.latent_dim)))["params"]
  codebooks = jnp.zeros((config.num_levels, config.codebook_size, config.latent_dim), jnp.float32)
  return {"encoder": enc, "decoder": dec, "codebooks": codebooks}


def encode(params, config: RQVAEConfig, x: jax.Array) -> jax.Array:
  """Encoder: [B, in] embeddings -> [B, d] latents."""
  return _encoder(config).apply({"params": params["encoder"]}, x)


def decode(params, config: RQVAEConfig, z: jax.Array) -> jax.Array:
  """Decoder: [B, d] latents -> [B, in] reconstructions."""
  return _decoder(config, _input_dim(params)).apply({"params": params["decoder"]}, z)


def nearest_code(codebook: jax.Array, r: jax.Array) -> jax.Array:
  """Index of the nearest code (squared Euclidean), ties -> lowest index.

  Args:
    codebook: [K, d].
    r: [B, d].

  Returns:
    int32 [B].
  """
  d2 = (jnp.sum(r * r, -1, keepdims=True) - 2.0 * r @ codebook.T
        + jnp.sum(codebook * codebook, -1)[None, :])  # [B, K]
  return jnp.argmin(d2, axis=-1).astype(jnp.int32)


def residual_quantize(codebooks: jax.Array, z: jax.Array, beta: float):
  """Residual quantisation of z with TIGER's codebook + commitment losses.

  Args:
    codebooks: [L, K, d].
    z: [B, d] latents.
    beta: commitment weight.

  Returns:
    codes: int32 [B, L];
    quantized: [B, d] sum_l e_l (gradient flows to the codebooks only through the loss);
    residuals: [L, B, d] r_l, the vector quantised at each level;
    loss: scalar, mean over the batch of sum_l (||sg[r_l] - e_l||^2 + beta ||r_l - sg[e_l]||^2).
  """
  r = z
  codes, residuals = [], []
  quantized = jnp.zeros_like(z)
  loss = 0.0
  for level in range(codebooks.shape[0]):
    idx = nearest_code(jax.lax.stop_gradient(codebooks[level]), jax.lax.stop_gradient(r))  # [B]
    e = codebooks[level][idx]  # [B, d]
    loss += jnp.mean(jnp.sum((jax.lax.stop_gradient(r) - e) ** 2, -1))
    loss += beta * jnp.mean(jnp.sum((r - jax.lax.stop_gradient(e)) ** 2, -1))
    codes.append(idx)
    residuals.append(r)
    quantized = quantized + e
    r = r - jax.lax.stop_gradient(e)
  return jnp.stack(codes, -1), quantized, jnp.stack(residuals), loss


@functools.partial(jax.jit, static_argnames=("config",))
def loss_fn(params, config: RQVAEConfig, x: jax.Array):
  """RQ-VAE loss on a batch.

  Args:
    params: the params pytree.
    config: the RQ-VAE config.
    x: [B, in] embeddings.

  Returns:
    (loss, aux): loss = recon + quant (scalar); aux = {'recon': mean_b ||x - x_hat||^2,
    'quant': the residual-quantisation loss, 'codes': int32 [B, L]}.
  """
  z = encode(params, config, x)  # [B, d]
  codes, quantized, _, quant = residual_quantize(params["codebooks"], z, config.beta)
  z_q = z + jax.lax.stop_gradient(quantized - z)  # straight-through estimator
  x_hat = decode(params, config, z_q)  # [B, in]
  recon = jnp.mean(jnp.sum((x - x_hat) ** 2, -1))
  return recon + quant, {"recon": recon, "quant": quant, "codes": codes}


def kmeans_plus_plus(key: jax.Array, points: jax.Array, k: int) -> jax.Array:
  """k-means++ seeding: each next centroid is a point drawn with probability ~ its squared
  distance to the nearest centroid so far.

  Args:
    key: PRNG key.
    points: [N, d].
    k: number of centroids.

  Returns:
    [k, d] initial centroids.
  """
  first_key, key = jax.random.split(key)
  first = points[jax.random.randint(first_key, (), 0, points.shape[0])]
  centroids = jnp.zeros((k, points.shape[1]), points.dtype).at[0].set(first)
  d2 = jnp.sum((points - first) ** 2, -1)  # [N]

  def add(i, carry):
    centroids, d2 = carry
    logits = jnp.where(d2 > 0, jnp.log(jnp.maximum(d2, 1e-30)), -jnp.inf)
    logits = jnp.where(jnp.any(d2 > 0), logits, 0.0)  # fewer distinct points than k: uniform
    new = points[jax.random.categorical(jax.random.fold_in(key, i), logits)]
    return centroids.at[i].set(new), jnp.minimum(d2, jnp.sum((points - new) ** 2, -1))

  centroids, _ = jax.lax.fori_loop(1, k, add, (centroids, d2))
  return centroids


def kmeans(key: jax.Array, points: jax.Array, k: int, iters: int) -> jax.Array:
  """Lloyd's k-means from a k-means++ seeding; an empty cluster keeps its centroid.

  Args:
    key: PRNG key (seeding).
    points: [N, d], N >= k.
    k: number of clusters.
    iters: Lloyd iterations.

  Returns:
    [k, d] centroids.
  """
  init = kmeans_plus_plus(key, points, k)

  def step(centroids, _):
    assign = nearest_code(centroids, points)  # [N]
    onehot = jax.nn.one_hot(assign, k, dtype=points.dtype)  # [N, k]
    counts = onehot.sum(0)  # [k]
    sums = onehot.T @ points  # [k, d]
    new = jnp.where(counts[:, None] > 0, sums / jnp.maximum(counts, 1.0)[:, None], centroids)
    return new, None

  centroids, _ = jax.lax.scan(step, init, None, length=iters)
  return centroids


@functools.partial(jax.jit, static_argnames=("config",))
def kmeans_init_codebooks(params, config: RQVAEConfig, x: jax.Array, key: jax.Array) -> jax.Array:
  """Level-by-level k-means on the latents of x, then on the successive residuals.

  Args:
    params: the params pytree (encoder used).
    config: the RQ-VAE config.
    x: [N, in] embeddings, N >= K.
    key: PRNG key.

  Returns:
    [L, K, d] codebooks.
  """
  r = encode(params, config, x)  # [N, d]
  books = []
  for level_key in jax.random.split(key, config.num_levels):
    book = kmeans(level_key, r, config.codebook_size, config.kmeans_iters)
    books.append(book)
    r = r - book[nearest_code(book, r)]
  return jnp.stack(books)


@functools.partial(jax.jit, static_argnames=("config",))
def _codes_and_residuals(params, config: RQVAEConfig, x: jax.Array):
  """(codes int32 [N, L], residuals [L, N, d]) of all of x."""
  codes, _, residuals, _ = residual_quantize(
      params["codebooks"], encode(params, config, x), config.beta)
  return codes, residuals


@functools.partial(jax.jit, static_argnames=("config",))
def reset_dead_codes(params, config: RQVAEConfig, x: jax.Array, key: jax.Array):
  """Replaces each level's codes unused by all of x with residuals of random items at that level.

  Args:
    params: the params pytree.
    config: the RQ-VAE config.
    x: [N, in] all embeddings.
    key: PRNG key.

  Returns:
    (params with new codebooks, int32 [L] number of codes reset per level).
  """
  codes, residuals = _codes_and_residuals(params, config, x)  # [N, L], [L, N, d]
  books = params["codebooks"]
  n = x.shape[0]
  new_books, num_reset = [], []
  for level, level_key in enumerate(jax.random.split(key, config.num_levels)):
    used = jnp.zeros(config.codebook_size, bool).at[codes[:, level]].set(True)  # [K]
    picks = jax.random.randint(level_key, (config.codebook_size,), 0, n)  # [K]
    new_books.append(jnp.where(used[:, None], books[level], residuals[level][picks]))
    num_reset.append(jnp.sum(~used))
  return {**params, "codebooks": jnp.stack(new_books)}, jnp.stack(num_reset).astype(jnp.int32)


def make_optimizer(config: RQVAEConfig) -> "optax.GradientTransformation":
  """Adam or Adagrad (TIGER) at `config.learning_rate`."""
  import optax  # here and in train_epochs: what reads a build's SIDs loads no optimiser

  if config.optimizer == "adagrad":
    return optax.adagrad(config.learning_rate)
  return optax.adam(config.learning_rate)


@functools.partial(jax.jit, static_argnames=("config", "epochs"), donate_argnums=(0, 1))
def train_epochs(params, opt_state, config: RQVAEConfig, x: jax.Array, key: jax.Array,
                 epochs: int):
  """`epochs` shuffled passes over x (the remainder of each permutation is dropped), as one scan.

  Args:
    params: the params pytree (donated).
    opt_state: the optax state (donated).
    config: the RQ-VAE config.
    x: [N, in] embeddings.
    key: PRNG key for the shuffles.
    epochs: number of passes (static).

  Returns:
    (params, opt_state, {'loss', 'recon', 'quant'}: [epochs] means over each epoch's steps).
  """
  import optax

  optimizer = make_optimizer(config)
  n = x.shape[0]
  batch = min(config.batch_size, n)
  steps = n // batch

  def train_step(carry, idx):  # idx: [batch]
    p, s = carry
    (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(p, config, x[idx])
    updates, s = optimizer.update(grads, s, p)
    return (optax.apply_updates(p, updates), s), (loss, aux["recon"], aux["quant"])

  def epoch(carry, epoch_key):
    order = jax.random.permutation(epoch_key, n)[:steps * batch].reshape(steps, batch)
    carry, (loss, recon, quant) = jax.lax.scan(train_step, carry, order)
    return carry, (loss.mean(), recon.mean(), quant.mean())

  (params, opt_state), (loss, recon, quant) = jax.lax.scan(
      epoch, (params, opt_state), jax.random.split(key, epochs))
  return params, opt_state, {"loss": loss, "recon": recon, "quant": quant}


def code_stats(codes: np.ndarray, codebook_size: int) -> dict:
  """Utilisation and collision statistics of 3-level (L-level) codes.

  Args:
    codes: int [I, L].
    codebook_size: K.

  Returns:
    {'utilisation': [L] fraction of the K codes used at each level,
     'distinct_prefixes': [L] distinct prefixes of length 1..L,
     'collision_rate': fraction of items whose full code is shared with an earlier item
       (= 1 - distinct / I, the items that get a 4th token > 0),
     'max_collisions': the largest number of items sharing one full code (the 4th vocabulary).}
  """
  codes = np.asarray(codes)
  num_items, num_levels = codes.shape
  _, counts = np.unique(codes, axis=0, return_counts=True)
  return {
      "utilisation": [len(np.unique(codes[:, level])) / codebook_size
                      for level in range(num_levels)],
      "distinct_prefixes": [len(np.unique(codes[:, :level + 1], axis=0))
                            for level in range(num_levels)],
      "collision_rate": 1.0 - len(counts) / num_items,
      "max_collisions": int(counts.max()),
  }


def train_rqvae(embeddings: np.ndarray, config: RQVAEConfig, seed: int = 0) -> tuple[dict, dict]:
  """Trains the RQ-VAE on all item embeddings; deterministic given the seed (on one machine).

  Args:
    embeddings: float [I, in] item embeddings (I >= codebook_size).
    config: the RQ-VAE config.
    seed: PRNG seed (init, k-means, shuffles, resets).

  Returns:
    (params, stats): stats = `code_stats` of the final codes plus 'recon_loss' and 'quant_loss'
    (over all items, final params), 'loss_history' (per-epoch mean train loss), 'codes_reset'
    (codes reset per level, summed), 'train_seconds'.
  """
  x = np.asarray(embeddings)
  if x.ndim != 2 or not np.issubdtype(x.dtype, np.floating) or not np.isfinite(x).all():
    raise ValueError(f"train_rqvae: embeddings must be a finite float [I, d] array, got "
                     f"{x.dtype} {x.shape}")
  if x.shape[0] < config.codebook_size:
    raise ValueError(f"data.rqvae.codebook_size={config.codebook_size} exceeds the "
                     f"{x.shape[0]} items (k-means needs an item per code): set "
                     f"--config.data.rqvae.codebook_size={x.shape[0]} or less")
  start = time.perf_counter()
  x = jnp.asarray(x, jnp.float32)
  k_init, k_kmeans, k_train = jax.random.split(jax.random.key(seed), 3)
  params = init_params(k_init, config, x.shape[1])
  params["codebooks"] = kmeans_init_codebooks(params, config, x, k_kmeans)
  opt_state = make_optimizer(config).init(params)

  chunk = config.reset_every if config.reset_every > 0 else config.epochs
  last_reset = int(config.epochs * config.reset_fraction) if config.reset_every > 0 else 0
  history, codes_reset, done = [], np.zeros(config.num_levels, np.int64), 0
  bar = progress(config.epochs, desc="RQ-VAE", unit="epoch")
  while done < config.epochs:
    epochs = min(chunk, config.epochs - done)
    k_train, k_epochs, k_reset = jax.random.split(k_train, 3)
    params, opt_state, metrics = train_epochs(params, opt_state, config, x, k_epochs, epochs)
    history.extend(np.asarray(metrics["loss"]).tolist())
    done += epochs
    bar.update(epochs)
    bar.set_postfix(loss=f"{history[-1]:.4f}")
    if done <= last_reset and done < config.epochs:
      params, num_reset = reset_dead_codes(params, config, x, k_reset)
      codes_reset += np.asarray(num_reset)

  bar.close()
  _, aux = loss_fn(params, config, x)
  stats = code_stats(np.asarray(aux["codes"]), config.codebook_size)
  stats.update(recon_loss=float(aux["recon"]), quant_loss=float(aux["quant"]),
               loss_history=history, codes_reset=codes_reset.tolist(),
               train_seconds=time.perf_counter() - start)
  return params, stats


def encode_codes(params, config: RQVAEConfig, embeddings: np.ndarray) -> np.ndarray:
  """The 3 (L) residual codes of each item.

  Args:
    params: trained params.
    config: the config they were trained with.
    embeddings: float [I, in].

  Returns:
    int32 [I, L].
  """
  codes, _ = _codes_and_residuals(params, config, jnp.asarray(embeddings, jnp.float32))
  return np.asarray(codes, np.int32)


def semantic_ids(codes: np.ndarray, max_collisions: int = MAX_COLLISIONS) -> np.ndarray:
  """Appends TIGER's collision token: the rank of the item among items sharing its codes.

  Items sharing a code tuple get 4th tokens 0, 1, 2, ... in item-index order, so every SID is
  unique, e.g. (12, 24, 52, 0), (12, 24, 52, 1).

  Args:
    codes: int [I, L].
    max_collisions: size of the collision vocabulary; more items on one code tuple is an error.

  Returns:
    int32 [I, L + 1].

  Raises:
    ValueError: more than `max_collisions` items share one code tuple.
  """
  codes = np.asarray(codes, np.int32)
  _, group, counts = np.unique(codes, axis=0, return_inverse=True, return_counts=True)
  group = group.reshape(-1)  # [I]
  if counts.max() > max_collisions:
    worst = int(np.argmax(counts))
    raise ValueError(f"semantic_ids: {counts.max()} items share codes "
                     f"{codes[group == worst][0].tolist()}, more than the collision vocabulary "
                     f"{max_collisions}; train a better RQ-VAE (utilisation) or raise the cap")
  order = np.argsort(group, kind="stable")  # items grouped, index order inside a group
  first = np.concatenate([[0], np.cumsum(counts)[:-1]])  # [G] start of each group in `order`
  rank = np.empty_like(group)
  rank[order] = np.arange(len(group)) - first[group[order]]
  return np.concatenate([codes, rank[:, None].astype(np.int32)], axis=1)


def save_sids(path: str | pathlib.Path, sids: np.ndarray) -> None:
  """Saves int32 [I, 4] SIDs as .npy (checked unique)."""
  sids = _check_sids(np.asarray(sids), path)
  np.save(pathlib.Path(path), sids, allow_pickle=False)


def load_sids(path: str | pathlib.Path, num_items: int | None = None) -> np.ndarray:
  """Loads SIDs saved by `save_sids`.

  Args:
    path: the .npy file.
    num_items: the expected I, or None to skip that check.

  Returns:
    int32 [I, L + 1].

  Raises:
    ValueError: unreadable file, wrong dtype / shape, negative or duplicate SIDs (names the file).
  """
  try:
    sids = np.load(pathlib.Path(path), allow_pickle=False)
  except (OSError, ValueError) as e:
    raise ValueError(f"{path}: cannot read SIDs as a .npy array: {e}") from e
  sids = _check_sids(sids, path)
  if num_items is not None and sids.shape[0] != num_items:
    raise ValueError(f"{path}: SIDs have {sids.shape[0]} rows, expected num_items={num_items}")
  return sids


def _check_sids(sids: np.ndarray, path) -> np.ndarray:
  """Validates an integer [I, L+1] array of unique non-negative SIDs; returns it as int32."""
  if not np.issubdtype(sids.dtype, np.integer) or sids.ndim != 2 or sids.shape[1] < 2:
    raise ValueError(f"{path}: SIDs must be an integer [I, L+1] array, got {sids.dtype} "
                     f"{sids.shape}")
  if (sids < 0).any():
    raise ValueError(f"{path}: SIDs hold negative codes (first row "
                     f"{int(np.argmax((sids < 0).any(1)))})")
  if len(np.unique(sids, axis=0)) != sids.shape[0]:
    raise ValueError(f"{path}: SIDs are not unique")
  return sids.astype(np.int32)
