"""Tests for gr2jax/data/batches.py on hand-made records and a toy tokenizer."""

import numpy as np
import pytest

from gr2jax.data import batches, prompts, tokenizer
from tests.data.toy_records import toy_catalog, toy_example, toy_sids

LAMBDA_R, LAMBDA_O = 0.5, 1.0
BUCKETS = (256, 512, 1024)


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


def _batch(encoded, tok, batch_size=8):
  return batches.make_batch(encoded, batch_size=batch_size, buckets=BUCKETS,
                            pad_id=tok.pad_token_id, lambda_r=LAMBDA_R, lambda_o=LAMBDA_O)


def test_batch_layout_spans_and_weights(setup):
  rendered, encoded, tok, examples = setup
  batch = _batch(encoded, tok)
  b, t = batch["tokens"].shape
  assert b == 8 and t in BUCKETS and t >= max(e.length for e in encoded)
  assert batch["candidate_tokens"].shape[:2] == (8, 10)
  for row, r in enumerate(rendered):
    p, a, n = (batch[k][row] for k in ("prompt_lengths", "answer_start", "lengths"))
    tokens = batch["tokens"][row]
    assert tok.decode(tokens[:p]) == r.prompt
    assert tok.decode(tokens[p:a]) == r.reasoning
    assert tok.decode(tokens[a:n]) == r.answer
    assert (tokens[n:] == tok.pad_token_id).all() and batch["valid"][row].sum() == n
    w = batch["loss_weights"][row]
    assert (w[:p] == 0).all() and (w[p:a] == LAMBDA_R).all() and (w[a:n] == LAMBDA_O).all()
    assert (w[n:] == 0).all()
    prompt_tokens = tokens[:p].tolist()
    for label in batch["candidate_tokens"][row]:
      assert any(prompt_tokens[i:i + len(label)] == label.tolist() for i in range(p))
    assert batch["target_position"][row] == examples[row].target_position
  # The example without a teacher trace has no response and no loss.
  assert batch["lengths"][3] == batch["prompt_lengths"][3] and batch["loss_weights"][3].sum() == 0
  assert batch["example_mask"].tolist() == [True] * 7 + [False]
  assert batch["loss_weights"][7].sum() == 0
  np.testing.assert_array_equal(batch["positions"][2], np.arange(t))


def test_answer_span_starts_with_json(setup):
  _, encoded, tok, _ = setup
  batch = _batch(encoded, tok)
  first = tok.decode(batch["tokens"][0, batch["answer_start"][0]:batch["answer_start"][0] + 1])
  assert first.startswith("{")


def test_buckets_and_errors(setup):
  _, encoded, tok, _ = setup
  assert batches.bucket_length(257, BUCKETS) == 512
  with pytest.raises(ValueError, match="exceeds the longest length bucket 16"):
    batches.make_batch(encoded[:2], batch_size=2, buckets=(16,), pad_id=0, lambda_r=1,
                       lambda_o=1)
  with pytest.raises(ValueError, match="7 examples for a batch of 4"):
    _batch(encoded, tok, batch_size=4)


def test_iterator_seeded_shuffle(setup):
  _, encoded, tok, _ = setup
  kwargs = dict(batch_size=2, buckets=BUCKETS, pad_id=tok.pad_token_id, lambda_r=LAMBDA_R,
                lambda_o=LAMBDA_O)
  first = list(batches.iterate_batches(encoded, seed=1, num_epochs=2, **kwargs))
  again = list(batches.iterate_batches(encoded, seed=1, num_epochs=2, **kwargs))
  assert len(first) == 6  # 3 full batches per epoch, remainder dropped
  for x, y in zip(first, again, strict=True):
    np.testing.assert_array_equal(x["tokens"], y["tokens"])
  targets = [tuple(b["target_position"]) for b in first]
  assert targets[:3] != targets[3:]
  ordered = list(batches.iterate_batches(encoded, seed=0, shuffle=False, drop_remainder=False,
                                         **kwargs))
  assert len(ordered) == 4 and ordered[-1]["example_mask"].tolist() == [True, False]
  np.testing.assert_array_equal(ordered[0]["tokens"][0, :encoded[0].length],
                                np.concatenate([encoded[0].prompt, encoded[0].reasoning,
                                                encoded[0].answer]))
