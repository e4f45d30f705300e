"""GR2 chat prompt, teacher reasoning and JSON answer rendering (GR2, arXiv 2602.07774).

One example renders to three strings that are tokenized separately and concatenated:

  prompt    = <|im_start|>system ...<|im_end|> <|im_start|>user ...<|im_end|>
              <|im_start|>assistant\\n
  reasoning = <think>\\n{cited evidence}\\n</think>\\n\\n          (loss weight lambda_r)
  answer    = {"ranking":[label, ...]}<|im_end|>                (loss weight lambda_o)

Qwen3's own `<think>` block holds the short reasoning (the choice that keeps the 8B path's native
format; GR2, arXiv 2602.07774 leaves it open), and the JSON object holds only the ranked labels.
`style='chat'` is the paper-like prompt (system turn, headers, an instruction line, citations with
their brand/category text); `style='terse'` (the tiny default, measured in
docs/calibration_tiny_prompt.md) keeps only the chat markup, one line per item and citations as
`{label}<kind_bucket>`, so that a from-scratch model sees ~4x shorter sequences. The response
format (think block, JSON, end of turn) is the same in both styles.
Labels are the candidates' SID strings (`answer_format='sid'`) or slot tokens (`'slot'`); both go
through `gr2jax/data/answer.py`. WORKSPACE.md "Prompt and answer formats" shows rendered examples.

This module also names every added token of the prompt language (SID codes, slot labels, evidence
buckets, chat markup, the diffusion mask); `tokenizer.py` builds its vocabulary from them.
"""

import dataclasses
import json

import numpy as np

from gr2jax import settings
from gr2jax.data import evidence
from gr2jax.data.records import Catalog, RerankExample

ANSWER_FORMATS = ("sid", "slot")
STYLES = ("chat", "terse")
EVIDENCE_MODES = ("raw", "flags")
FIELDS = ("sid", "brand", "leaf", "title")
EVIDENCE_KINDS = ("brand", "leaf", "path")  # the columns of RerankExample.evidence

END_OF_TEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
THINK_START = "<think>"
THINK_END = "</think>"
MASK_TOKEN = "<|mask|>"
CHAT_TOKENS = (END_OF_TEXT, IM_START, IM_END, THINK_START, THINK_END, MASK_TOKEN)

SID_LEVEL_NAMES = "abcdefgh"
NO_TITLE = "(no title)"
NO_BRAND = "(no brand)"

SYSTEM_PROMPT = "You are an expert re-ranker of Amazon Beauty products for a user's next purchase."
NO_MATCH = "No history match; keep the retriever order."  # chat style; terse: an empty think block
REJECTION_SYSTEM = (  # GR2 principle (1), domain-knowledge priming (GR2, arXiv 2602.07774)
  "You are an expert in Amazon Beauty products and in how people shop for them: which products "
  "complete a routine (shampoo -> conditioner -> styling; cleanser -> toner -> moisturiser), when "
  "a shopper stays with a brand, and when they move on to a neighbouring category.")


@dataclasses.dataclass(frozen=True, kw_only=True)
class PromptSettings(settings.Settings):
  """How an example is shown to the model: a recipe's `data.prompt` block.

  Defaults are the tiny CPU setting (docs/calibration_tiny_prompt.md): a terse prompt of slot +
  evidence flags only (57 prompt / 29-35 response tokens), what a from-scratch tiny model learns
  to use in a CPU budget. The 8B/paper prompt: style 'chat', answer_format 'sid', evidence 'raw',
  fields FIELDS, history_items 20, max_citations 3.
  """

  WHERE = "data.prompt."

  style: str = settings.choice("terse", doc="'terse' (chat markup + one line per item, no "
                               "system turn, headers or instruction; citations = slot + "
                               "evidence token) or 'chat'", choices=STYLES)
  answer_format: str = settings.choice("slot", doc="'slot' (tiny: slot labels) or 'sid' (8B; "
                                       "the paper's: candidate SIDs)", choices=ANSWER_FORMATS)
  evidence: str = settings.choice("flags", doc="'flags' (tiny: per-candidate match buckets) or "
                                  "'raw' (8B: history items with their fields)",
                                  choices=EVIDENCE_MODES)
  fields: tuple[str, ...] = settings.texts((), doc="item fields shown, rendered in FIELDS order "
                                           "(tiny: none, the flags carry the evidence; 8B: all "
                                           "4)", choices=FIELDS)
  title_words: int = settings.integer(6, doc="title truncation (words) when 'title' is shown",
                                      minimum=1)
  history_items: int = settings.integer(0, doc="history items shown (0 = no history block; "
                                        "tiny: none, flags summarise 20; 8B: 20)", minimum=0)
  max_citations: int = settings.integer(2, doc="teacher citations rendered in the reasoning "
                                        "(8B: 3+)", minimum=0)


@dataclasses.dataclass(frozen=True, kw_only=True)
class PromptConfig(PromptSettings):
  """What the renderer reads: the build's PromptSettings and its evidence bucket count (fixed by
  data/evidence.py, not a recipe's choice; records and the TFDS step's key hold it)."""

  evidence_levels: int = settings.integer(evidence.NUM_BUCKETS, doc="evidence buckets per kind "
                                          "(bucket 0 = no match)", minimum=2)


def prompt_config(data_config, answer_format: str | None = None,
                  evidence_mode: str | None = None) -> PromptConfig:
  """The PromptConfig of a data build's `prompt` block (DataSettings or its ConfigDict),
  optionally with another answer format / evidence mode."""
  p = data_config.prompt
  return PromptConfig.of({**p.to_dict(), "answer_format": answer_format or p.answer_format,
                          "evidence": evidence_mode or p.evidence}, PromptSettings.WHERE)


@dataclasses.dataclass(frozen=True)
class RenderedExample:
  """The three text pieces of one example and its candidate labels.

  Attributes:
    prompt: system + user turns and the assistant header.
    reasoning: the `<think>` block ('' when the example has no teacher trace).
    answer: the JSON answer + end of turn ('' when the example has no teacher trace).
    labels: [N] the candidates' answer labels in D's order.
  """

  prompt: str
  reasoning: str
  answer: str
  labels: tuple[str, ...]


def sid_token(level: int, code: int) -> str:
  """The added token of one SID code, e.g. `<a_17>` for level 0 code 17."""
  return f"<{SID_LEVEL_NAMES[level]}_{code}>"


def slot_token(slot: int) -> str:
  """The added token labelling the candidate at position `slot` of D."""
  return f"<slot_{slot}>"


def evidence_token(kind: str, level: int) -> str:
  """The added token of an evidence bucket, e.g. `<brand_3>`."""
  return f"<{kind}_{level}>"


def added_tokens(codes_per_level: tuple[int, ...], num_slots: int,
                 evidence_levels: int) -> list[str]:
  """Every non-chat token the prompts can emit (SID codes, slots, evidence buckets), in id order.

  Args:
    codes_per_level: number of codes per SID level, e.g. (256, 256, 256, max_collision + 1).
    num_slots: N, the candidate list length.
    evidence_levels: buckets per evidence kind.

  Returns:
    The token strings; the chat tokens (CHAT_TOKENS) are not included.
  """
  if len(codes_per_level) > len(SID_LEVEL_NAMES):
    raise ValueError(f"{len(codes_per_level)} SID levels; at most {len(SID_LEVEL_NAMES)} supported")
  tokens = [sid_token(l, c) for l, n in enumerate(codes_per_level) for c in range(n)]
  tokens += [slot_token(s) for s in range(num_slots)]
  tokens += [evidence_token(k, v) for k in EVIDENCE_KINDS for v in range(evidence_levels)]
  return tokens


def sid_string(sid: np.ndarray) -> str:
  """The SID tokens of one item, e.g. `<a_17><b_203><c_5><d_0>`; sid is [L] int."""
  return "".join(sid_token(l, int(c)) for l, c in enumerate(sid))


def candidate_labels(example: RerankExample, sids: np.ndarray,
                     config: PromptConfig) -> tuple[str, ...]:
  """The answer labels of the candidates in D's order (SID strings or slot tokens).

  Args:
    example: the re-ranking example.
    sids: [num_items, L] int32 semantic IDs.
    config: prompt settings (answer_format decides the label kind).

  Returns:
    [N] label strings.
  """
  if config.answer_format == "sid":
    return tuple(sid_string(sids[i]) for i in example.candidates)
  return tuple(slot_token(s) for s in range(len(example.candidates)))


def _item_fields(item: int, catalog: Catalog, sids: np.ndarray, config: PromptConfig) -> str:
  """The configured fields of one item joined by ' | ' (in FIELDS order)."""
  parts = []
  for field in FIELDS:
    if field not in config.fields:
      continue
    if field == "sid":
      parts.append(sid_string(sids[item]))
    elif field == "brand":
      parts.append(catalog.brands[item] or NO_BRAND)
    elif field == "leaf":
      parts.append(catalog.categories[item][-1])
    else:
      title = catalog.titles[item]
      parts.append(" ".join(title.split()[: config.title_words]) if title else NO_TITLE)
  return " | ".join(parts)


def _join(label: str, text: str) -> str:
  """`label` then `text`, with a space only before plain text (a space before an added token
  would cost a token of its own)."""
  return label + (text if not text or text.startswith("<") else " " + text)


def _shown_history(example: RerankExample, config: PromptConfig) -> np.ndarray:
  """[h'] the most recent `history_items` items of the history, oldest first."""
  if config.history_items == 0:
    return example.history[:0]
  return example.history[-config.history_items:]


def _history_ref(position: int, example: RerankExample, config: PromptConfig) -> str | None:
  """The prompt's marker (`H1` = oldest shown) of history index `position`, None if not shown."""
  first_shown = len(example.history) - len(_shown_history(example, config))
  if position < first_shown:
    return None
  return f"H{position - first_shown + 1}"


def render_prompt(example: RerankExample, catalog: Catalog, sids: np.ndarray,
                  config: PromptConfig) -> str:
  """The chat prompt: (system role,) history (marked H1..), candidates (slot labels)(, spec).

  Args:
    example: the re-ranking example.
    catalog: item metadata.
    sids: [num_items, L] int32 semantic IDs.
    config: prompt settings; style='terse' drops the system turn, headers and instruction.

  Returns:
    The prompt text ending with the assistant header.
  """
  chat = config.style == "chat"
  header = " | ".join(f for f in FIELDS if f in config.fields)
  lines = []
  history = _shown_history(example, config)
  if len(history):
    if chat:
      lines.append(f"History, oldest first (H | {header}):")
    lines += [_join(f"H{i + 1}", _item_fields(int(item), catalog, sids, config))
              for i, item in enumerate(history)]
  flags = config.evidence == "flags"
  if chat:
    lines.append(f"Candidates in retriever order (slot | {header}"
                 f"{' | match brand leaf path' if flags else ''}):")
  evidence = np.asarray(example.evidence)
  levels = config.evidence_levels
  if flags and (evidence.min() < 0 or evidence.max() >= levels):
    raise ValueError(f"user {example.user}: evidence buckets {evidence.tolist()} outside "
                     f"[0, {levels})")
  for slot, item in enumerate(example.candidates):
    line = _join(slot_token(slot), _item_fields(int(item), catalog, sids, config))
    if flags:
      line += (" |" if chat else "") + "".join(
        evidence_token(k, int(v)) for k, v in zip(EVIDENCE_KINDS, evidence[slot], strict=True))
    lines.append(line)
  if chat:
    what = "candidate SIDs" if config.answer_format == "sid" else "candidate slots"
    lines.append(f"Reason briefly, then answer JSON {{\"ranking\": [all {len(example.candidates)} "
                 f"{what}, best first]}}.")
  user = "\n".join(lines)
  system = f"{IM_START}system\n{SYSTEM_PROMPT}{IM_END}\n" if chat else ""
  return f"{system}{IM_START}user\n{user}{IM_END}\n{IM_START}assistant\n"


def render_rejection_messages(example: RerankExample, catalog: Catalog, sids: np.ndarray,
                              config: PromptConfig) -> list[dict[str, str]]:
  """GR2's rejection-sampling teacher prompt as chat messages (GR2, arXiv 2602.07774).

  The principles of GR2's teacher prompt: (1) domain-knowledge priming (the system turn,
  REJECTION_SYSTEM), (2) items cited by their SID tokens, (3) the full shown history and all
  candidates together, (4) hierarchical steps (patterns -> complements -> selection), (5) one
  JSON object with both the reasoning and the ranked list. The target is never shown. The
  messages go through the teacher tokenizer's own chat template (data/llm_teacher.py).

  Args:
    example: the re-ranking example (its target is not used).
    catalog: item metadata.
    sids: [num_items, L] int32 semantic IDs.
    config: the labels (answer_format), item fields and history_items shown; a candidate whose
      label is its SID does not repeat the SID among its fields.

  Returns:
    [{"role": "system", ...}, {"role": "user", ...}].
  """
  labels = candidate_labels(example, sids, config)
  fields = tuple(f for f in FIELDS if f in config.fields)
  candidate_config = config if config.answer_format == "slot" else dataclasses.replace(
    config, fields=tuple(f for f in fields if f != "sid"))
  history = _shown_history(example, config)
  lines = [f"Purchase history, oldest first (H | {' | '.join(fields)}):"]
  lines += [_join(f"H{i + 1}", _item_fields(int(item), catalog, sids, config))
            for i, item in enumerate(history)] or ["(no history shown)"]
  lines.append("Candidates for the next purchase, in the retriever's order (label | "
               f"{' | '.join(candidate_config.fields)}):")
  lines += [_join(label, _item_fields(int(item), catalog, sids, candidate_config))
            for label, item in zip(labels, example.candidates, strict=True)]
  lines += [
    "Reason in three steps: (1) patterns: the brands, categories and routines that recur in the "
    "history; (2) complements: the candidates that continue or complete them; (3) selection: "
    f"the order of all {len(labels)} candidates. Cite items by their SID tokens.",
    'Answer with one JSON object and nothing else: {"reasoning": "<your three steps>", '
    f'"ranking": [all {len(labels)} candidate labels, best first]}}.']
  return [{"role": "system", "content": REJECTION_SYSTEM},
          {"role": "user", "content": "\n".join(lines)}]


def render_reasoning(example: RerankExample, labels: tuple[str, ...], config: PromptConfig) -> str:
  """The `<think>` block citing the teacher's evidence as it appears in the prompt.

  One line per citation (at most `max_citations`): `{candidate label} {kind} {value}: H.. H..`
  (chat style, or terse without flags) or `{candidate label}<{kind}_{bucket}>: H..` (terse style
  with evidence flags: the bucket token the prompt shows for that candidate), where the H markers
  are the shown history items that share it (newest first). No citation: the chat style says so
  (NO_MATCH), the terse style leaves the think block empty.

  Args:
    example: the example; its `citations` are rendered.
    labels: [N] candidate labels (from `candidate_labels`).
    config: prompt settings.

  Returns:
    The reasoning text including the think markers and the blank line before the answer.
  """
  lines = []
  for citation in example.citations[: config.max_citations]:
    if not 0 <= citation.slot < len(labels):
      raise ValueError(f"user {example.user}: citation slot {citation.slot} outside "
                       f"[0, {len(labels)})")
    refs = [_history_ref(p, example, config) for p in citation.history_positions]
    refs = [r for r in refs if r is not None]
    if config.style == "terse" and config.evidence == "flags":
      bucket = int(np.asarray(example.evidence)[citation.slot, EVIDENCE_KINDS.index(citation.kind)])
      line = labels[citation.slot] + evidence_token(citation.kind, bucket)
    else:
      line = f"{labels[citation.slot]} {citation.kind} {citation.value}"
    lines.append(f"{line}: {' '.join(refs)}" if refs else line)
  if not lines and config.style == "chat":
    lines = [NO_MATCH]
  return think_block("\n".join(lines))


def think_block(text: str) -> str:
  """Wraps reasoning text in the think markers and the blank line before the answer."""
  return f"{THINK_START}\n{text.strip()}\n{THINK_END}\n\n"


def render_answer(ranking: np.ndarray, labels: tuple[str, ...]) -> str:
  """The compact JSON answer `{"ranking":[...]}` + end of turn; ranking is [N] slots, best first."""
  ranking = np.asarray(ranking)
  if sorted(ranking.tolist()) != list(range(len(labels))):
    raise ValueError(f"ranking {ranking.tolist()} is not a permutation of {len(labels)} slots")
  body = json.dumps({"ranking": [labels[int(s)] for s in ranking]}, separators=(",", ":"))
  return body + IM_END


def render_example(example: RerankExample, catalog: Catalog, sids: np.ndarray,
                   config: PromptConfig, reasoning: str | None = None) -> RenderedExample:
  """Prompt, reasoning and answer of one example (empty target when it has no teacher ranking).

  Args:
    example: the re-ranking example.
    catalog: item metadata.
    sids: [num_items, L] int32 semantic IDs.
    config: prompt settings.
    reasoning: free-text reasoning (an LLM-written trace) used instead of rendering the
      example's citations.

  Returns:
    The rendered pieces and the candidate labels.
  """
  labels = candidate_labels(example, sids, config)
  prompt = render_prompt(example, catalog, sids, config)
  if example.teacher_ranking is None:
    return RenderedExample(prompt, "", "", labels)
  think = (render_reasoning(example, labels, config) if reasoning is None
           else think_block(reasoning))
  return RenderedExample(prompt, think, render_answer(example.teacher_ranking, labels), labels)
