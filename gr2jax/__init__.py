"""gr2jax: a JAX Qwen3 with block-diffusion decoding for generative re-ranking (Diffusion-GR2).

The public API, importable from a notebook without loading JAX until first use:

  recipe = gr2jax.recipes.get("tiny")                # every setting of a run (gr2jax/recipes.py)
  config, params = gr2jax.load_model(path)            # a gr2jax export or a local HF Qwen3 dir
  logits, cache = gr2jax.forward(params, config, tokens[B, T])   # fp32 [B, T, V]
  out = gr2jax.generate(params, config, prompts[B, P], lengths[B],
                        gr2jax.ARDecoding(max_new_tokens=N))   # AR (every decoder: settings last)
  out = gr2jax.block_diffusion_generate(params, config, prompts, lengths,
                                        gr2jax.BlockDecoding(threshold=0.9,
                                                             max_steps_per_block=64,
                                                             max_new_tokens=N))
  policy = gr2jax.make_policy(config, recipe.decode, N)   # the model's own decoder at the spec
  reranker = gr2jax.load_reranker("W/rl/export")   # THE inference object (or Reranker.of(...))
  answers = reranker.answer(encoded, labels, rows=B)   # decode + texts + parsed answers
  ranked = reranker.rows([reranker.prepare(request)], batch_rows=B)   # a request's answer rows
  rows = gr2jax.rerank("requests.jsonl", reranker)   # re-ranking requests (or an export path)

See WORKSPACE.md for the module map and contracts.
"""

import glob
import importlib
import os
import sys

# Device files whose presence means an accelerator JAX may use: NVIDIA's driver, TPU chips.
ACCELERATOR_FILES = ("/proc/driver/nvidia", "/dev/nvidiactl", "/dev/accel*", "/dev/vfio")


def default_to_cpu_without_accelerator() -> bool:
  """JAX_PLATFORMS=cpu where no accelerator exists and the user chose no platform; True if set.

  requirements-aot.txt installs the compile-only CUDA plugin everywhere; on a machine with no
  NVIDIA driver JAX then tries to load CUDA at its first backend use and logs a traceback
  ("Unable to load CUDA") before falling back to the CPU, on every command. Naming the CPU up
  front gives the same backend without it. Must run before JAX starts a backend: at `import
  gr2jax`, through the environment, or through jax.config if JAX is already imported.
  """
  if os.environ.get("JAX_PLATFORMS") or any(glob.glob(p) for p in ACCELERATOR_FILES):
    return False
  os.environ["JAX_PLATFORMS"] = "cpu"
  if "jax" in sys.modules:
    sys.modules["jax"].config.update("jax_platforms", "cpu")
  return True


default_to_cpu_without_accelerator()

_EXPORTS = {
    "ModelConfig": "gr2jax.model.config",
    "KVCache": "gr2jax.model.cache",
    "init_cache": "gr2jax.model.cache",
    "init_params": "gr2jax.model.params",
    "forward": "gr2jax.model.qwen3",
    "generate": "gr2jax.model.generate",
    "ARDecoding": "gr2jax.model.generate",
    "block_diffusion_generate": "gr2jax.diffusion.decode",
    "BlockDecoding": "gr2jax.diffusion.decode",
    "Steering": "gr2jax.diffusion.decode",
    "DecodeSpec": "gr2jax.decoding.spec",
    "make_policy": "gr2jax.decoding.policy",
    "Reranker": "gr2jax.decoding.reranker",
    "load_reranker": "gr2jax.decoding.reranker",
    "load_model": "gr2jax.load",
    "recipes": "gr2jax.recipes",
    "rerank": "gr2jax.apps.rerank",
}

_MODULES = ("rerank", "recipes")  # exported as the module itself
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
  """Imports the public names lazily (PEP 562), so `import gr2jax` stays light."""
  if name not in _EXPORTS:
    raise AttributeError(f"module 'gr2jax' has no attribute {name!r}")
  module = importlib.import_module(_EXPORTS[name])
  # gr2jax.rerank is a module whose calls go to its rerank() (gr2jax/apps/rerank.py), and
  # gr2jax.recipes a module: exporting the module itself keeps `from gr2jax import rerank` the
  # same object whatever was imported first.
  value = module if name in _MODULES else getattr(module, name)
  globals()[name] = value
  return value


def __dir__():
  return sorted(set(globals()) | set(__all__))
