"""Tests for gr2jax/data/prompts.py on hand-made records."""

import dataclasses
import json
import re

import numpy as np
import pytest

from gr2jax.data import prompts
from tests.data.toy_records import toy_catalog, toy_example, toy_sids

VARIANTS = [prompts.PromptConfig(style="chat", answer_format=a, evidence=e, fields=prompts.FIELDS,
                                 history_items=5)
            for a in prompts.ANSWER_FORMATS for e in prompts.EVIDENCE_MODES]
CHAT = prompts.PromptConfig(style="chat", fields=("sid", "brand", "leaf"), history_items=3)


@pytest.mark.parametrize("config", VARIANTS, ids=lambda c: f"{c.answer_format}-{c.evidence}")
def test_prompt_shows_history_then_candidates_with_fields(config):
  catalog, sids, ex = toy_catalog(), toy_sids(), toy_example()
  rendered = prompts.render_example(ex, catalog, sids, config)
  prompt = rendered.prompt
  assert prompt.startswith("<|im_start|>system\n")
  assert prompt.endswith("<|im_end|>\n<|im_start|>assistant\n")
  shown = ex.history[-config.history_items:]
  history_at = [prompt.index(f"\nH{i + 1}{prompts.sid_string(sids[item])}")
                for i, item in enumerate(shown)]
  slot_at = [prompt.index(f"\n{prompts.slot_token(s)}{prompts.sid_string(sids[item])}")
             for s, item in enumerate(ex.candidates)]
  assert history_at == sorted(history_at) and slot_at == sorted(slot_at)
  assert history_at[-1] < slot_at[0]
  assert f"H{len(shown) + 1}<" not in prompt
  for item in list(shown) + list(ex.candidates):
    brand = catalog.brands[item] or prompts.NO_BRAND
    title = catalog.titles[item]
    words = " ".join(title.split()[: config.title_words]) if title else prompts.NO_TITLE
    line = (f"{prompts.sid_string(sids[item])} | {brand} | {catalog.categories[item][-1]} | "
            f"{words}")
    assert line in prompt
  has_flags = "<brand_" in prompt
  assert has_flags == (config.evidence == "flags")
  if has_flags:
    kinds_levels = zip(prompts.EVIDENCE_KINDS, ex.evidence[3], strict=True)
    flags = "".join(prompts.evidence_token(k, v) for k, v in kinds_levels)
    assert f" |{flags}\n{prompts.slot_token(4)}" in prompt


@pytest.mark.parametrize("config", VARIANTS, ids=lambda c: f"{c.answer_format}-{c.evidence}")
def test_response_is_reasoning_then_json_answer(config):
  catalog, sids, ex = toy_catalog(), toy_sids(), toy_example()
  rendered = prompts.render_example(ex, catalog, sids, config)
  assert rendered.reasoning.startswith("<think>\n")
  assert rendered.reasoning.endswith("\n</think>\n\n")
  assert rendered.answer.endswith("<|im_end|>")
  answer = json.loads(rendered.answer.removesuffix("<|im_end|>"))
  assert answer == {"ranking": [rendered.labels[s] for s in ex.teacher_ranking]}
  # Citation of slot 2 (history positions 7, 1): only 7 is among the 5 shown items -> H5.
  assert f"{rendered.labels[2]} brand Maybelline: H5\n" in rendered.reasoning
  assert f"{rendered.labels[5]} leaf Mascara: H4" in rendered.reasoning
  if config.answer_format == "sid":
    assert rendered.labels[0] == prompts.sid_string(sids[ex.candidates[0]])
  else:
    assert rendered.labels == tuple(f"<slot_{s}>" for s in range(10))


def test_no_teacher_and_no_citations():
  catalog, sids = toy_catalog(), toy_sids()
  config = CHAT
  plain = prompts.render_example(toy_example(with_teacher=False), catalog, sids, config)
  assert plain.reasoning == "" and plain.answer == ""
  ex = dataclasses.replace(toy_example(), citations=())
  assert "keep the retriever order" in prompts.render_example(ex, catalog, sids, config).reasoning
  trace = prompts.render_example(toy_example(), catalog, sids, config, reasoning=" Pick c2. ")
  assert trace.reasoning == "<think>\nPick c2.\n</think>\n\n"


def test_fields_and_history_length_are_configurable():
  catalog, sids, ex = toy_catalog(), toy_sids(), toy_example()
  config = prompts.PromptConfig(style="chat", fields=("brand",), history_items=0, evidence="raw")
  prompt = prompts.render_prompt(ex, catalog, sids, config)
  assert "<a_" not in prompt and "History" not in prompt and "Product" not in prompt
  assert "\n<slot_9> " in prompt  # a space before plain text only
  long = prompts.render_prompt(ex, catalog, sids, dataclasses.replace(CHAT, history_items=50))
  assert len(re.findall(r"\nH\d+<", long)) == len(ex.history)


def test_missing_title_placeholder():
  catalog, sids, ex = toy_catalog(), toy_sids(), toy_example()
  missing = [i for i in list(ex.history[-5:]) + list(ex.candidates) if catalog.titles[i] is None]
  config = prompts.PromptConfig(fields=prompts.FIELDS, history_items=5)
  prompt = prompts.render_prompt(ex, catalog, sids, config)
  assert missing and prompt.count(prompts.NO_TITLE) == len(missing)


def test_bad_inputs_raise_clear_errors():
  catalog, sids, ex = toy_catalog(), toy_sids(), toy_example()
  with pytest.raises(ValueError, match="answer_format"):
    prompts.PromptConfig(answer_format="ids")
  with pytest.raises(ValueError, match="style"):
    prompts.PromptConfig(style="verbose")
  with pytest.raises(ValueError, match="fields"):
    prompts.PromptConfig(fields=("price",))
  bad = dataclasses.replace(ex, evidence=np.full((10, 3), 7, np.int32))
  with pytest.raises(ValueError, match="user 0: evidence"):
    prompts.render_prompt(bad, catalog, sids, prompts.PromptConfig())
  with pytest.raises(ValueError, match="permutation"):
    prompts.render_answer(np.array([0, 0, 1]), ("a", "b", "c"))


def test_added_tokens_cover_rendered_tokens():
  tokens = prompts.added_tokens((256, 256, 256, 3), 10, 5)
  assert len(tokens) == len(set(tokens)) == 256 * 3 + 3 + 10 + 15
  catalog, sids, ex = toy_catalog(), toy_sids(), toy_example()
  for style in prompts.STYLES:
    config = prompts.PromptConfig(style=style, answer_format="sid", fields=prompts.FIELDS)
    rendered = prompts.render_example(ex, catalog, sids, config)
    text = rendered.prompt + rendered.reasoning + rendered.answer
    used = set(re.findall(r"<[^<>\s]+>", text))
    assert used <= set(tokens) | set(prompts.CHAT_TOKENS)


def test_terse_default_prompt_is_slots_and_flags_only():
  catalog, sids, ex = toy_catalog(), toy_sids(), toy_example()
  config = prompts.PromptConfig()  # the tiny default
  assert (config.style, config.answer_format, config.evidence) == ("terse", "slot", "flags")
  rendered = prompts.render_example(ex, catalog, sids, config)
  lines = [prompts.slot_token(s) + "".join(prompts.evidence_token(k, int(v)) for k, v in
                                           zip(prompts.EVIDENCE_KINDS, ex.evidence[s], strict=True))
           for s in range(10)]
  assert rendered.prompt == ("<|im_start|>user\n" + "\n".join(lines)
                             + "<|im_end|>\n<|im_start|>assistant\n")
  # Citations name the candidate and the evidence token its prompt line shows.
  brand, leaf = int(ex.evidence[2, 0]), int(ex.evidence[5, 1])
  assert rendered.reasoning == (f"<think>\n<slot_2><brand_{brand}>\n<slot_5><leaf_{leaf}>\n"
                                "</think>\n\n")
  assert json.loads(rendered.answer.removesuffix("<|im_end|>")) == {
    "ranking": [rendered.labels[s] for s in ex.teacher_ranking]}
  # No citation: an empty think block (Qwen3's own no-thinking form).
  none = prompts.render_example(dataclasses.replace(ex, citations=()), catalog, sids, config)
  assert none.reasoning == "<think>\n\n</think>\n\n"


@pytest.mark.parametrize("evidence", prompts.EVIDENCE_MODES)
def test_terse_with_fields_and_history(evidence):
  catalog, sids, ex = toy_catalog(), toy_sids(), toy_example()
  config = prompts.PromptConfig(evidence=evidence, fields=("brand", "leaf"), history_items=5)
  rendered = prompts.render_example(ex, catalog, sids, config)
  prompt = rendered.prompt
  assert prompt.startswith("<|im_start|>user\nH1 ")
  assert "system" not in prompt and "History" not in prompt and "Reason" not in prompt
  item = int(ex.candidates[4])
  line = f"\n<slot_4> {catalog.brands[item] or prompts.NO_BRAND} | {catalog.categories[item][-1]}"
  flags = "".join(prompts.evidence_token(k, int(v))
                  for k, v in zip(prompts.EVIDENCE_KINDS, ex.evidence[4], strict=True))
  assert line + (flags if evidence == "flags" else "") + "\n<slot_5>" in prompt
  # Citation of slot 2 (history positions 7, 1): only 7 is among the 5 shown items -> H5.
  cited = (f"<slot_2><brand_{int(ex.evidence[2, 0])}>" if evidence == "flags"
           else "<slot_2> brand Maybelline")
  assert f"{cited}: H5\n" in rendered.reasoning


@pytest.mark.parametrize("answer_format", prompts.ANSWER_FORMATS)
def test_rejection_messages_follow_the_gr2_teacher_principles(answer_format):
  catalog, sids, ex = toy_catalog(), toy_sids(), toy_example()
  config = prompts.PromptConfig(style="chat", answer_format=answer_format, evidence="raw",
                                fields=prompts.FIELDS, history_items=20)
  system, user = prompts.render_rejection_messages(ex, catalog, sids, config)
  assert system == {"role": "system", "content": prompts.REJECTION_SYSTEM}
  assert user["role"] == "user"
  text = user["content"]
  labels = prompts.candidate_labels(ex, sids, config)
  # the whole history (oldest first) and every candidate, each item with its SID
  history_at = [text.index(f"\nH{i + 1}{prompts.sid_string(sids[item])} | ")
                for i, item in enumerate(ex.history)]
  slot_at = [text.index(f"\n{label}" + ("" if answer_format == "sid" else
                                        prompts.sid_string(sids[item])))
             for label, item in zip(labels, ex.candidates, strict=True)]
  assert history_at == sorted(history_at) and history_at[-1] < slot_at[0] == min(slot_at)
  assert text.count(prompts.sid_string(sids[ex.candidates[0]])) == 1  # a SID label is not repeated
  assert "(1) patterns" in text and "(3) selection" in text  # hierarchical steps
  assert '{"reasoning": "<your three steps>", "ranking": [all 10 candidate labels' in text
  target = ex.candidates[ex.target_position]
  other = prompts.render_rejection_messages(
    dataclasses.replace(ex, target_position=(ex.target_position + 1) % 10), catalog, sids, config)
  assert other == [system, user]  # the target is nowhere in the prompt
  assert catalog.titles[target].split()[0] in text  # (shown as a candidate like any other)
