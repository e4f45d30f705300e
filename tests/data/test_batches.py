"""Tests for gr2jax/data/batches.py: tokenized pieces on hand-made records and a toy tokenizer,
and the Batch type's field selection."""

import jax
import numpy as np
import pytest

from gr2jax.data import batches, prompts, tokenizer
from gr2jax.data.batches import Batch
from gr2jax.diffusion import replay
from tests.data.toy_records import toy_catalog, toy_example, toy_sids


@pytest.fixture(scope="module", params=prompts.ANSWER_FORMATS)
def setup(request, tmp_path_factory):
  config = prompts.PromptConfig(answer_format=request.param, fields=prompts.FIELDS)
  catalog, sids = toy_catalog(), toy_sids()
  examples = [toy_example(user=u, with_teacher=u != 3) for u in range(7)]
  rendered = [prompts.render_example(ex, catalog, sids, config) for ex in examples]
  tok = tokenizer.train_tokenizer(
    [r.prompt + r.reasoning + r.answer for r in rendered], str(tmp_path_factory.mktemp("tok")),
    vocab_size=1400, codes_per_level=(256, 256, 256, 3), num_slots=10, evidence_levels=5)
  encoded = batches.encode_examples(rendered, [ex.target_position for ex in examples], tok)
  return rendered, encoded, tok, examples


def test_pieces_decode_back_and_labels_are_in_the_prompt(setup):
  rendered, encoded, tok, examples = setup
  for ex, r, e in zip(examples, rendered, encoded, strict=True):
    assert tok.decode(e.prompt) == r.prompt
    assert tok.decode(e.reasoning) == r.reasoning and tok.decode(e.answer) == r.answer
    assert e.label_tokens.shape[0] == 10 and e.target_position == ex.target_position
    prompt = e.prompt.tolist()
    for label in e.label_tokens:
      assert any(prompt[i:i + len(label)] == label.tolist() for i in range(len(prompt)))
  # The example without a teacher trace has no response.
  assert len(encoded[3].reasoning) == len(encoded[3].answer) == 0
  assert tok.decode(encoded[0].answer[:1]).startswith("{")


def test_targets_must_match_the_examples(setup):
  rendered, _, tok, _ = setup
  with pytest.raises(ValueError, match="7 rendered examples but 2 targets"):
    batches.encode_examples(rendered, [0, 1], tok)


def test_select_keeps_only_the_named_fields():
  batch = Batch(prompt_tokens=np.zeros((2, 3), np.int32), prompt_lengths=np.ones(2, np.int32),
                example_mask=np.ones(2, bool), replay_rounds=replay.Rounds(2))
  assert batch.num_rows == 2
  only = batch.select(("prompt_tokens", "replay_rounds"))
  assert only.prompt_lengths is None and only.example_mask is None
  assert only.replay_rounds == replay.Rounds(2) and only.prompt_tokens is batch.prompt_tokens
  assert len(jax.tree.leaves(only)) == 1  # a static Rounds and None fields hold no leaves
  with pytest.raises(ValueError, match="field 'logp_old' is not set"):
    batch.select(("prompt_tokens", "logp_old"))
  with pytest.raises(ValueError, match="no field 'tokens'"):
    batch.select(("tokens",))
