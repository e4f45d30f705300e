"""Tests for gr2jax/data/tokenizer.py: render -> tokenize -> decode round-trips, SID tokens."""

import json
import os
import re
import shutil

import pytest
import tokenizers
import transformers

from gr2jax.data import prompts, tokenizer
from tests.data.toy_records import toy_catalog, toy_example, toy_sids

CODES = (256, 256, 256, 3)
VARIANTS = [prompts.PromptConfig(style=s, answer_format=a, evidence=e, fields=prompts.FIELDS,
                                 history_items=3)
            for s in prompts.STYLES for a in prompts.ANSWER_FORMATS
            for e in prompts.EVIDENCE_MODES]


def _rendered():
  catalog, sids = toy_catalog(), toy_sids()
  return [prompts.render_example(toy_example(user=u), catalog, sids, c)
          for u in range(4) for c in VARIANTS]


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
  out = str(tmp_path_factory.mktemp("tok"))
  texts = [r.prompt + r.reasoning + r.answer for r in _rendered()]
  tokenizer.train_tokenizer(texts, out, vocab_size=1400, codes_per_level=CODES, num_slots=10,
                            evidence_levels=5)
  return out


def test_autotokenizer_loads_with_specials(tok_dir):
  tok = transformers.AutoTokenizer.from_pretrained(tok_dir)
  assert len(tok) <= 1400  # a corpus this small runs out of merges before the BPE budget
  assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
  for t in prompts.CHAT_TOKENS + ("<a_255>", "<d_2>", "<slot_9>", "<path_4>"):
    assert len(tok.encode(t, add_special_tokens=False)) == 1, t
  learned = [t for t in tok.get_vocab() if t.startswith("<a_") and t not in ("<a_255>",)]
  assert all(t in prompts.added_tokens(CODES, 10, 5) for t in learned)


QWEN3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"
               r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")  # Qwen3's tokenizer.json pre-tokenizer


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory):
  """An extended Qwen3-like tokenizer (the 8B path: extend_tokenizer of a base whose
  tokenizer.json holds Qwen3's pipeline, saved as tokenizer_class Qwen2Tokenizer)."""
  from tokenizers import Regex, decoders, models, normalizers, pre_tokenizers, trainers

  base, out = (str(tmp_path_factory.mktemp(name)) for name in ("qwen_base", "qwen_ext"))
  tok = tokenizers.Tokenizer(models.BPE())
  tok.normalizer = normalizers.NFC()
  tok.pre_tokenizer = pre_tokenizers.Sequence([
    pre_tokenizers.Split(Regex(QWEN3_SPLIT), behavior="isolated"),
    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=600, show_progress=False,
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  tok.train_from_iterator([r.prompt + r.reasoning for r in _rendered()], trainer=trainer)
  tok.add_special_tokens([tokenizers.AddedToken(t, normalized=False, special=True)
                          for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")])
  transformers.PreTrainedTokenizerFast(
    tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
    clean_up_tokenization_spaces=False).save_pretrained(base)
  config_file = os.path.join(base, "tokenizer_config.json")
  with open(config_file) as f:
    config = json.load(f) | {"tokenizer_class": "Qwen2Tokenizer", "unk_token": None}
  with open(config_file, "w") as f:
    json.dump(config, f)
  tokenizer.extend_tokenizer(base, out, codes_per_level=CODES, num_slots=10, evidence_levels=5)
  return out


@pytest.mark.parametrize("which", ["build", "qwen3"])
def test_load_tokenizer_gives_autotokenizers_ids_without_torch(tok_dir, qwen_dir, which):
  """load_tokenizer (PreTrainedTokenizerFast over tokenizer.json, no torch) encodes and decodes
  as AutoTokenizer does, chat, SID, slot, evidence and mask tokens included: a build's tokenizer
  and an extended Qwen3 one (AutoTokenizer's Qwen2Tokenizer class)."""
  path = tok_dir if which == "build" else qwen_dir
  auto = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
  tok = tokenizer.load_tokenizer(path)
  assert (type(auto).__name__ == "Qwen2Tokenizer") == (which == "qwen3")
  assert tok.get_vocab() == auto.get_vocab() and len(tok) == len(auto)
  assert tok.all_special_tokens == auto.all_special_tokens
  for name in ("eos_token_id", "pad_token_id", "unk_token_id"):
    assert getattr(tok, name) == getattr(auto, name), name
  specials = "".join(prompts.CHAT_TOKENS) + "<a_255><d_2><slot_9><path_4>"
  texts = [piece for r in _rendered() for piece in (r.prompt, r.reasoning, r.answer)]
  texts += [specials, "Caf\u00e9  na\u0131\u0308ve\r\n x's 12345 " + specials, "", " \n\n "]
  ids = tok(texts, add_special_tokens=False)["input_ids"]
  assert ids == auto(texts, add_special_tokens=False)["input_ids"]
  assert tok.convert_tokens_to_ids(list(prompts.CHAT_TOKENS)) == auto.convert_tokens_to_ids(
    list(prompts.CHAT_TOKENS))
  for skip in (False, True):
    assert ([tok.decode(i, skip_special_tokens=skip) for i in ids]
            == [auto.decode(i, skip_special_tokens=skip) for i in ids])


@pytest.mark.parametrize("missing", [["tokenizer.json"], ["tokenizer_config.json"],
                                     list(tokenizer.FILES)])
def test_a_directory_without_its_tokenizer_files_is_named(tok_dir, tmp_path, missing):
  """One line naming the directory and every missing file (transformers would suggest
  installing sentencepiece without tokenizer.json, and load with no eos / pad token without
  tokenizer_config.json)."""
  for name in tokenizer.FILES:
    if name not in missing:
      shutil.copyfile(os.path.join(tok_dir, name), tmp_path / name)
  with pytest.raises(FileNotFoundError, match=(
      rf"^{re.escape(str(tmp_path))}: no tokenizer file\(s\) {', '.join(missing)} \(a tokenizer "
      r"directory holds tokenizer\.json and tokenizer_config\.json\)$")):
    tokenizer.load_tokenizer(str(tmp_path))


@pytest.mark.parametrize("index", range(len(VARIANTS)))
def test_round_trip_and_single_token_sids(tok_dir, index):
  tok = tokenizer.load_tokenizer(tok_dir)
  rendered = _rendered()[index]
  for piece in (rendered.prompt, rendered.reasoning, rendered.answer):
    ids = tok.encode(piece, add_special_tokens=False)
    assert tok.decode(ids) == piece
  ids = tok.encode(rendered.prompt, add_special_tokens=False)
  pieces = tok.convert_ids_to_tokens(ids)
  sids = toy_sids()
  for item in toy_example(user=index // len(VARIANTS)).candidates:
    sid = [prompts.sid_token(level, int(code)) for level, code in enumerate(sids[item])]
    assert any(pieces[i:i + 4] == sid for i in range(len(pieces))), sid
  for label in rendered.labels:
    label_ids = tok.encode(label, add_special_tokens=False)
    assert len(label_ids) == (4 if rendered.labels[0].startswith("<a_") else 1)
  # Decoding with skip_special_tokens keeps SID/slot tokens but drops chat markup.
  text = tok.decode(tok.encode(rendered.answer, add_special_tokens=False),
                    skip_special_tokens=True)
  assert rendered.labels[0] in text and "<|im_end|>" not in text


def test_vocab_too_small_raises(tmp_path):
  with pytest.raises(ValueError, match="vocab_size=900"):
    tokenizer.train_tokenizer(["abc"], str(tmp_path), vocab_size=900, codes_per_level=CODES,
                              num_slots=10, evidence_levels=5)


def test_extend_tokenizer_writes_added_tokens(tok_dir, tmp_path):
  base = tmp_path / "base"
  plain = tokenizer.train_tokenizer(["hello world <think>"], str(base), vocab_size=1200,
                                    codes_per_level=(256, 256, 256, 1), num_slots=10,
                                    evidence_levels=5)
  out = tmp_path / "extended"
  added = tokenizer.extend_tokenizer(str(base), str(out), codes_per_level=CODES, num_slots=12,
                                     evidence_levels=5)
  assert added == ["<d_1>", "<d_2>", "<slot_10>", "<slot_11>"]
  with open(os.path.join(out, tokenizer.ADDED_TOKENS_FILE)) as f:
    assert f.read().splitlines() == added
  tok = tokenizer.load_tokenizer(str(out))
  assert len(tok) == len(plain) + 4
  assert tok.convert_tokens_to_ids("<slot_11>") == len(tok) - 1
  with pytest.raises(FileNotFoundError, match="missing"):
    tokenizer.extend_tokenizer(str(tmp_path / "missing"), str(out), codes_per_level=CODES,
                               num_slots=10, evidence_levels=5)
