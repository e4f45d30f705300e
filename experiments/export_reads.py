"""What the studies read of a workdir's data build and an export of it: `check_build` refuses an
export trained on another data build (eval.py's check; bench_speedup.py, bench_speculative.py),
`read_diffusion` reads a block-diffusion export and a split of the build (cft_validity.py,
duplicate_commits.py), and ANSWER_START is the text that opens a decoded answer's JSON.
"""

import dataclasses
import os
from typing import NamedTuple

from absl import app

from gr2jax import exports, load
from gr2jax.data import lengths as lengths_lib
from gr2jax.data import pipeline, prompts, rqvae
from gr2jax.data import tokenizer as tokenizer_lib
from gr2jax.decoding import prompt_io
from gr2jax.model.config import ModelConfig

ANSWER_START = '{"ranking"'  # a decoded answer's JSON opens with it (gr2jax/data/answer.py)


class DiffusionRead(NamedTuple):
  """A block-diffusion export and a split of its data build, as the diagnostics read them."""
  config: ModelConfig
  params: dict
  tokenizer: object
  data: prompt_io.SplitData
  prompt_len: int
  response_len: int


def check_build(ckpt: str, summary: dict, tokenizer) -> None:
  """Refuses an export trained on another data build than the workdir's, by eval.py's check
  (exports.check_data_build): the data build record of W's build (its tokenizer, prompt format
  and semantic IDs) against the one the export records. A summary.json written before it
  recorded the prompt format compares the export's own prompt (a build differing in its prompt
  alone is then not seen). An export that records no data build (a converted or HF checkpoint)
  is not checked.

  Raises:
    ValueError: naming the export and each field that differs (checkpoint vs W).
  """
  recorded = exports.load_metadata(ckpt).get("data_build") if os.path.isdir(ckpt) else None
  if not recorded:
    return
  known = {field.name for field in dataclasses.fields(prompts.PromptConfig)}
  prompt = prompts.PromptConfig(**{name: tuple(value) if isinstance(value, list) else value
                                   for name, value in summary.get("prompt",
                                                                  recorded["prompt"]).items()
                                   if name in known})
  sids_file = summary["paths"].get("sids")  # a build summarised before the field: not compared
  sids = rqvae.load_sids(sids_file) if sids_file else None
  exports.check_data_build(ckpt, exports.data_build_record(tokenizer, prompt, sids))


def read_diffusion(ckpt: str, workdir: str, split: str, limit: int) -> DiffusionRead:
  """--ckpt's model and --split of W's data build (read only: its summary.json paths); the
  export's data build is checked against W's before its weights load (check_build).

  Raises:
    app.UsageError: --workdir holds no data build, or --ckpt is not a block-diffusion model.
    ValueError: --ckpt was trained on another data build (check_build).
  """
  if not os.path.isfile(os.path.join(workdir, "summary.json")):
    raise app.UsageError(f"--workdir={workdir}: no summary.json (not a data build)")
  summary = pipeline.read_summary(workdir)
  tok = tokenizer_lib.load_tokenizer(summary["paths"]["tokenizer"])
  check_build(ckpt, summary, tok)
  config, params = load.load_model(ckpt)
  if config.mask_token_id is None:
    raise app.UsageError(f"--ckpt={ckpt} is not a diffusion model")
  data = prompt_io.load_split(summary["paths"]["tfds"], split, tok, limit=limit)
  return DiffusionRead(config, params, tok, data, *lengths_lib.static_lengths(summary))
