"""A toy run context for the training tests: toy records, a toy tokenizer, short prompts."""

import dataclasses

import numpy as np

from gr2jax import exports, recipe, recipes
from gr2jax.data import batches, prompts, tokenizer
from gr2jax.data import lengths as lengths_lib
from gr2jax.decoding import prompt_io
from gr2jax.train import loop
from gr2jax.train import mesh as mesh_lib
from tests.data.toy_records import toy_catalog, toy_example, toy_sids

PROMPT = prompts.PromptConfig(answer_format="slot", evidence="flags", fields=("brand",),
                              history_items=0, max_citations=1)


def toy_split(tok, users, with_teacher=True) -> prompt_io.SplitData:
  catalog, sids = toy_catalog(), toy_sids()
  examples = [toy_example(user=u, with_teacher=with_teacher) for u in users]
  rendered = [prompts.render_example(ex, catalog, sids, PROMPT) for ex in examples]
  encoded = batches.encode_examples(rendered, [ex.target_position for ex in examples], tok)
  teacher = [int(ex.teacher_ranking[0]) if ex.teacher_ranking is not None else -1
             for ex in examples]
  return prompt_io.SplitData(encoded, np.asarray(users), [r.labels for r in rendered],
                          np.asarray(teacher, np.int32))


def toy_tokenizer(out_dir: str):
  catalog, sids = toy_catalog(), toy_sids()
  texts = []
  for u in range(24):
    r = prompts.render_example(toy_example(user=u), catalog, sids, PROMPT)
    texts.append(r.prompt + r.reasoning + r.answer)
  return tokenizer.train_tokenizer(texts, out_dir, vocab_size=1200,
                                   codes_per_level=(256, 256, 256, 3), num_slots=10,
                                   evidence_levels=5)


def toy_config(stage="sft", **train) -> recipe.StageView:
  """The tiny recipe's view of `stage` with toy step counts, from a fresh toy model (a test
  names another init or swaps a block with dataclasses.replace)."""
  config = recipe.stage_config(recipe.from_config(recipes.config("", stage)), stage, "workdir")
  return dataclasses.replace(
    config, train=config.train.replace(**{**dict(steps=6, batch_size=8, save_every=2, keep=5,
                                                  async_save=False), **train}),
    optimizer=config.optimizer.replace(warmup_steps=2), init="preset:tiny",
    model=dataclasses.replace(config.model, attention_chunk_bytes=8 << 20),
    eval=dataclasses.replace(config.eval, batch_size=8))


def toy_lengths(splits) -> tuple[int, int]:
  """(P, R) of toy splits, as data/lengths.py computes them from a data build's summary."""
  p = max(len(e.prompt) for s in splits for e in s.encoded)
  r = max(len(e.reasoning) + len(e.answer) for s in splits for e in s.encoded)
  return lengths_lib.round_up(p), lengths_lib.round_up(max(r, 1))


def toy_context(config, tok, workdir, mesh=None) -> loop.Context:
  train = toy_split(tok, range(24))
  evaluation = toy_split(tok, range(100, 108), with_teacher=False)
  p, r = toy_lengths([train, toy_split(tok, range(100, 108))])
  mesh = mesh_lib.make_mesh(fsdp=1, devices=[__import__("jax").devices()[0]]) if mesh is None \
    else mesh
  return loop.Context(config, None, tok, train, evaluation, p, r, mesh, workdir,
                      exports.data_build_record(tok, PROMPT))
