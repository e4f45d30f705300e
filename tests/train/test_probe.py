"""The held-out probe (gr2jax/train/probe.py): the stage's own objective on fixed held-out
prompts, the same numbers for the same params, padded prompts counted nowhere."""

import dataclasses

import numpy as np
import pytest

from gr2jax.train import loop, probe, stages
from tests.train.toy import toy_config, toy_context, toy_split, toy_tokenizer


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
  from gr2jax.data import tokenizer as tokenizer_lib
  out = str(tmp_path_factory.mktemp("tok"))
  toy_tokenizer(out)
  return tokenizer_lib.load_tokenizer(out)


def test_probe_batches_keep_order_and_mask_the_padding(tok):
  split = toy_split(tok, range(100, 105), with_teacher=False)
  batches = probe.probe_batches(split, batch_size=4, prompt_len=256, response_len=64, pad_id=0,
                                lambda_r=0.5, lambda_o=1.0)
  assert [b.example_index.tolist() for b in batches] == [[0, 1, 2, 3], [4, 4, 4, 4]]
  assert [b.example_mask.tolist() for b in batches] == [[True] * 4, [True] + [False] * 3]


def test_ar_rl_probe_reports_its_rollouts_objective_the_same_for_the_same_params(tmp_path, tok):
  config = toy_config("ar_rl", batch_size=4)
  config = dataclasses.replace(config, settings=dataclasses.replace(config.settings,
                                                                    group_size=2))
  ctx = toy_context(config, tok, str(tmp_path))
  model_config, params = loop.model_from_init("preset:tiny", tok, config.train)
  ctx.model_config = model_config
  stage = stages.stage("ar_rl")
  held_out = probe.make_probe(ctx, stage, stage.make_loss(ctx), ctx.eval)  # 8 prompts, 2 batches
  first = held_out(params)
  assert {"reward", "valid_rate", "tokens_per_forward", "kept_groups"} <= set(first)
  assert ("loss" in first) == (first["kept_groups"] > 0)  # no kept group: no tokens to weigh
  assert -1.0 <= first["reward"] <= 1.2 and 0.0 <= first["valid_rate"] <= 1.0
  assert first["tokens_per_forward"] == 1.0  # AR: one forward per token
  assert held_out(params) == first  # fixed prompts and keys: only the params move it


def test_self_distillation_probe_reports_its_loss_and_the_decode_at_its_threshold(tmp_path,
                                                                                    tok):
  """OPD's 'self' objective: CFT's loss on its own valid slow-decode answers, their validity,
  and the greedy decode at the stage's rollout threshold (the deployed one) beside them; an
  AR stage has no such decode."""
  from gr2jax.data.prompts import MASK_TOKEN
  from gr2jax.diffusion import convert

  config = toy_config("opd", batch_size=4)
  config = dataclasses.replace(config, settings=dataclasses.replace(
    config.settings, objective="self", certainty=2.0, rollout_tau=0.5))
  ctx = toy_context(config, tok, str(tmp_path))
  model_config, params = loop.model_from_init("preset:tiny", tok, config.train)
  ctx.model_config = convert.to_diffusion(model_config, 4,
                                          int(tok.convert_tokens_to_ids(MASK_TOKEN)))
  stage = stages.stage("opd")
  held_out = probe.make_probe(ctx, stage, stage.make_loss(ctx), ctx.eval)
  first = held_out(params)
  assert {"self_valid_rate", "self_forwards_per_token", "deployed_valid_rate",
          "deployed_forwards_per_token"} <= set(first)
  assert first["self_forwards_per_token"] >= 1.0  # tau 1.0: one token per forward at most
  assert 0.0 < first["deployed_forwards_per_token"] <= first["self_forwards_per_token"]
  assert held_out(params) == first
  ar = toy_config("ar_rl", batch_size=4)
  assert probe.deployed_decode(toy_context(ar, tok, str(tmp_path)), stages.stage("ar_rl"),
                               ctx.eval) is None


def test_probe_needs_the_data_build(tmp_path, tok):
  ctx = toy_context(toy_config("sft"), tok, str(tmp_path))
  with pytest.raises(ValueError, match="train.probe_prompts needs the data build"):
    probe.load(ctx, 8)
  assert np.all(ctx.eval.target_position >= 0)
