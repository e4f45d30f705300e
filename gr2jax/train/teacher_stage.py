"""The LLM-teacher stage: a local LLM writes the SFT reasoning traces (GR2's rejection sampling).

  python experiments/run.py --config=teacher.py --config.teacher.hf_dir=/models/Qwen3-32B \
      --workdir=W

The model side of gr2jax/data/llm_teacher.py (which holds the users, prompts, judging, resumable
batch files and summary; read its docstring): `load_teacher` loads the teacher sharded over the
mesh, `model_sampler` samples it in static batches with the project's `generate`, and `run`
builds the data, renders every selected user's prompt and runs the rejection-sampling loop.
"""

import contextlib
import dataclasses
import os
import types

import jax
import numpy as np

from gr2jax import exports, load
from gr2jax.data import lengths as lengths_lib
from gr2jax.data import llm_teacher, pipeline, prompts, rqvae
from gr2jax.data import tokenizer as tokenizer_lib
from gr2jax.data.llm_teacher import SampleFn, TeacherSpec
from gr2jax.workdir import lock_workdir


def _model_dtype(spec: TeacherSpec) -> str | None:
  """The params' dtype: bf16 on accelerators for 'auto'; None keeps the checkpoint's."""
  if spec.param_dtype == "auto":
    return None if jax.default_backend() == "cpu" else "bfloat16"
  return spec.param_dtype


def load_teacher(spec: TeacherSpec, mesh) -> tuple:
  """(ModelConfig, params sharded over `mesh`) of spec.hf_dir (a gr2jax checkpoint or an HF
  Qwen3 directory), in the dtype of `_model_dtype` (activations and KV cache too)."""
  from gr2jax.hf import weights as hf_weights
  from gr2jax.model import sharding as model_sharding

  dtype = _model_dtype(spec)
  is_gr2jax = os.path.isfile(os.path.join(spec.hf_dir, exports.CONFIG_FILE))
  config = (exports.load_config(spec.hf_dir) if is_gr2jax
            else hf_weights.read_config(spec.hf_dir, dtype))
  config, params = load.load_model(spec.hf_dir, model_sharding.param_shardings(config, mesh),
                                         None if is_gr2jax else dtype)
  if dtype is not None:
    params = jax.tree.map(lambda x: x.astype(dtype), params)
    config = dataclasses.replace(config, param_dtype=dtype, compute_dtype=dtype)
  return config, params


def model_sampler(params: dict, config, tokenizer, mesh, *, batch_size: int, prompt_len: int,
                  max_new_tokens: int, temperature: float, top_p: float) -> SampleFn:
  """The default sample_fn: model/generate.py over static [batch_size, prompt_len] batches.

  Rows past the given prompts repeat the last one (dropped from the result); each batch is placed
  with the mesh's batch sharding (every process fills only its own rows) and the responses are
  gathered to every process. Decoding stops at the model's eos ids and the tokenizer's end of turn.
  """
  from gr2jax.decoding import prompt_io
  from gr2jax.model import generate as generate_lib
  from gr2jax.model import sharding as model_sharding
  from gr2jax.train import mesh as mesh_lib

  im_end = tokenizer.convert_tokens_to_ids(prompts.IM_END)
  stop = tuple(sorted(set(config.eos_token_ids) | (
    {int(im_end)} if im_end is not None and im_end != tokenizer.unk_token_id else set())))
  decoding = generate_lib.ARDecoding(max_new_tokens=max_new_tokens, temperature=temperature,
                                     top_p=top_p, stop_token_ids=stop)
  sharding = mesh_lib.batch_sharding(mesh)

  def sample(prompt_ids, key):
    tokens, lengths = prompt_io.prompt_arrays([types.SimpleNamespace(prompt=p) for p in prompt_ids],
                                           batch_size, prompt_len, config.pad_token_id)
    batch = model_sharding.global_arrays({"tokens": tokens, "lengths": lengths}, sharding)
    with jax.set_mesh(mesh):
      out = generate_lib.generate(params, config, batch["tokens"], batch["lengths"], decoding,
                                  key=key)
    tokens, lengths = model_sharding.host_arrays((out.tokens, out.lengths))
    n = len(prompt_ids)
    return prompt_io.response_texts(tokenizer, tokens[:n], lengths[:n]), lengths[:n]

  return sample


def _tokenizer_dir(spec: TeacherSpec, build_tokenizer: str) -> str:
  if spec.tokenizer_dir:
    return spec.tokenizer_dir
  if spec.hf_dir and any(os.path.isfile(os.path.join(spec.hf_dir, f))
                         for f in ("tokenizer.json", "tokenizer_config.json")):
    return spec.hf_dir
  return build_tokenizer


def run(spec: TeacherSpec, data_config, workdir: str, *, sample_fn: SampleFn | None = None,
        out_dir: str = "") -> dict:
  """The teacher stage: traces for the data build of `data_config` in `workdir` (module doc).

  Args:
    spec: the teacher's settings.
    data_config: the data build's config (experiments/configs/data.py; built here if needed).
    workdir: the run's workdir (the data build's).
    sample_fn: generation; None loads spec.hf_dir and samples with `model_sampler`. A stand-in
      (tests) gets the same prompts and its texts go through the same parsing and files.
    out_dir: the output directory ('' = <workdir>/teacher, the chain's teacher step).

  Returns:
    The summary dict (module docstring), also written to <out_dir>/summary.json.

  Raises:
    gr2jax.workdir.InUseError: another live run writes the same output directory.
    ValueError: the output holds rows of another teacher digest.
    llm_teacher.NoTracesError: no user was accepted (the files are written first).
  """
  if not spec.hf_dir and sample_fn is None:
    raise ValueError("the teacher stage needs --config.teacher.hf_dir=<HF Qwen3 dir or gr2jax "
                     "checkpoint>")
  if spec.hf_dir and not os.path.isdir(spec.hf_dir):
    raise FileNotFoundError(f"teacher.hf_dir={spec.hf_dir!r} is not a directory")
  out_dir = out_dir or os.path.join(workdir, "teacher")
  lock = lock_workdir(out_dir) if jax.process_index() == 0 else contextlib.nullcontext()
  with lock:
    summary = pipeline.run(data_config, workdir)
    catalog, examples = pipeline.training_lists(data_config, workdir)
    sids = rqvae.load_sids(summary["paths"]["sids"], catalog.num_items)
    tokenizer = tokenizer_lib.load_tokenizer(_tokenizer_dir(spec, summary["paths"]["tokenizer"]))
    prompt_config = prompts.prompt_config(data_config)
    users = llm_teacher.select_users(len(examples), spec.num_users, spec.seed)
    chosen = [examples[i] for i in users]
    prompt_ids = llm_teacher.encode_prompts(chosen, catalog, sids, prompt_config, tokenizer,
                                            spec.prompt, data_config.max_history)
    labels = [prompts.candidate_labels(e, sids, prompt_config) for e in chosen]
    model = llm_teacher.model_digest(spec.hf_dir) if spec.hf_dir else ""
    digest = llm_teacher.teacher_digest(spec, model, data_config)
    if sample_fn is None:
      from gr2jax.train import mesh as mesh_lib

      mesh = mesh_lib.make_mesh(*spec.mesh)
      if spec.batch_size % mesh_lib.batch_size_multiple(mesh):
        raise ValueError(f"teacher.batch_size={spec.batch_size} is not a multiple of the mesh's "
                         f"batch shards ({mesh_lib.batch_size_multiple(mesh)})")
      config, params = load_teacher(spec, mesh)
      sample_fn = model_sampler(params, config, tokenizer, mesh, batch_size=spec.batch_size,
                                prompt_len=lengths_lib.round_up(max(len(p) for p in prompt_ids)),
                                max_new_tokens=spec.max_new_tokens,
                                temperature=spec.temperature, top_p=spec.top_p)
    return llm_teacher.generate_traces(sample_fn, prompt_ids, labels,
                           np.asarray([e.user for e in chosen], np.int64),
                           np.asarray([e.target_position for e in chosen]), spec, out_dir,
                           digest, tokenizer)
