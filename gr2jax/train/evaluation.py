"""The one evaluation: decode a split, validate every answer, score the rankings.

Used by `--config=eval.py` on any checkpoint and by every training stage for its periodic and
final evaluation. AR models decode greedily with gr2jax.model.generate; diffusion models
(config.mask_token_id set) with gr2jax.diffusion.decode.block_diffusion_generate at threshold tau
and the checkpoint's block size. Each response is parsed by gr2jax.data.answer.parse_answer;
anything but a valid permutation falls back to D's order (counted per failure kind), and the
target's rank in the resulting list gives R@1 / R@3 / N@3 (gr2jax.metrics).
"""

import json
import os
import re
import time

import jax
import numpy as np

from gr2jax import metrics as metrics_lib
from gr2jax.data import answer, prompts
from gr2jax.diffusion import constrain
from gr2jax.diffusion import decode as diffusion_decode
from gr2jax.model import generate as generate_lib
from gr2jax.model.config import ModelConfig
from gr2jax.progress import progress
from gr2jax.train import inputs


def label_levels(tokenizer, depth: int) -> list[list[int]]:
  """Token ids of each answer-label level: slot tokens (depth 1) or the SID levels a, b, c, d."""
  vocab = tokenizer.get_vocab()
  patterns = [r"<slot_\d+>"] if depth == 1 else [rf"<{c}_\d+>" for c in "abcdefgh"[:depth]]
  return [sorted(i for t, i in vocab.items() if re.fullmatch(p, t)) for p in patterns]


def answer_constraint(tokenizer, config: ModelConfig, label_tokens: np.ndarray):
  """The decoding-time answer constraint (diffusion/constrain.py) of a batch's candidates.

  Args:
    tokenizer: the data build's tokenizer.
    config: the model (its vocabulary size).
    label_tokens: [B, N, Lc] int32 each candidate's label tokens.
  """
  return constrain.make_constraint(label_tokens, label_levels(tokenizer, label_tokens.shape[2]),
                                   config.vocab_size,
                                   tokenizer.convert_tokens_to_ids(prompts.THINK_END))


def decode_batch(params: dict, config: ModelConfig, prompt_tokens: np.ndarray,
                 prompt_lengths: np.ndarray, *, max_new_tokens: int, tau: float,
                 max_steps_per_block: int, temperature: float = 0.0, key=None,
                 constraint=None, commit_order: str = "confidence",
                 response_prefix=None) -> dict:
  """Decodes one batch of right-padded prompts with the checkpoint's own decoder.

  Args:
    params, config: the model; diffusion when config.mask_token_id is set.
    prompt_tokens: [B, P] int32; prompt_lengths: [B] int32.
    max_new_tokens: response cap.
    tau: the diffusion commit threshold (ignored for AR).
    max_steps_per_block: the diffusion denoising-step cap per block (paper: 64).
    temperature: 0 greedy; > 0 samples with `key`.
    key: PRNG key for sampling.
    constraint: an AnswerConstraint (diffusion only; the constrained-decoding ablation).
    commit_order: the diffusion commit order (commit.ORDERS; 'confidence' = the paper's).
    response_prefix: optional (tokens [B, F], lengths [B]) given response tokens (diffusion
      only; block_diffusion_generate).

  Returns:
    {'tokens' [B, N], 'lengths' [B], 'nfe' [B] forwards per row (prefill and commit forwards
     included), 'denoise_steps' [B] the paper's NFE (denoising steps; AR: tokens)}.
  """
  if config.mask_token_id is not None:
    out = diffusion_decode.block_diffusion_generate(
      params, config, prompt_tokens, prompt_lengths, block_size=config.block_size,
      threshold=tau, max_steps_per_block=max_steps_per_block, max_new_tokens=max_new_tokens,
      temperature=temperature, key=key, constraint=constraint, commit_order=commit_order,
      response_prefix=response_prefix)
    nfe = np.asarray(out.nfe)
    denoise = np.asarray(out.denoise_steps)
  else:
    if constraint is not None or response_prefix is not None:
      raise ValueError("constrained decoding and a given response prefix are diffusion-decoder "
                       "options; this model is AR")
    sampling = generate_lib.Sampling(temperature=temperature)
    out = generate_lib.generate(params, config, prompt_tokens, prompt_lengths,
                                max_new_tokens=max_new_tokens, sampling=sampling, key=key)
    nfe = np.full(prompt_tokens.shape[:1], int(out.nfe))
    denoise = np.asarray(out.lengths)  # AR: one forward per token (the paper's B = 1 count)
  return {"tokens": np.asarray(out.tokens), "lengths": np.asarray(out.lengths), "nfe": nfe,
          "denoise_steps": denoise}


def response_texts(tokenizer, tokens: np.ndarray, lengths: np.ndarray) -> list[str]:
  """Detokenized responses (special tokens kept, so the parser sees the end of turn)."""
  return [tokenizer.decode(row[:n].tolist(), skip_special_tokens=False)
          for row, n in zip(tokens, lengths, strict=True)]


def score(results: list, data: inputs.SplitData) -> dict:
  """Ranking metrics, validity and agreement of parsed answers over a split.

  Args:
    results: [E] AnswerResults in the split's order.
    data: the split.

  Returns:
    R@1 / R@3 / N@3 / R@10, 'R@1_se' (binomial standard error), valid rate and per-kind counts,
    top-1 agreement with D's order and (where the split carries it) with the rule teacher.
  """
  rankings = np.stack([r.ranking for r in results])  # [E, N] slots, fallback = D's order
  ranks = metrics_lib.target_ranks(rankings, data.target_position[:len(results)])
  out = metrics_lib.ranking_metrics(ranks, ks=(1, 3, 10))
  r1 = out["R@1"]
  out["R@1_se"] = float(np.sqrt(r1 * (1 - r1) / len(results)))
  summary = answer.summarize(results)
  out["valid_rate"] = summary["valid_rate"]
  out["counts"] = summary["counts"]
  out["top1_is_D_first"] = float(np.mean(rankings[:, 0] == 0))
  teacher = data.teacher_top1[:len(results)]
  has = teacher >= 0
  out["top1_is_teacher"] = float(np.mean(rankings[has, 0] == teacher[has])) if has.any() else None
  out["num"] = len(results)
  return out


def evaluate(params: dict, config: ModelConfig, data: inputs.SplitData, tokenizer, *,
             batch_size: int, prompt_len: int, max_new_tokens: int, tau: float = 1.0,
             max_steps_per_block: int = 64, out_path: str | None = None,
             desc: str = "eval", constrained: bool = False,
             commit_order: str = "confidence", given_reasoning: bool = False) -> dict:
  """Decodes, validates and scores a split; optionally writes per-example JSONL.

  Args:
    params, config: the model (AR or diffusion).
    data: the split (inputs.load_split).
    tokenizer: the data build's tokenizer.
    batch_size: decode batch size (the last batch is padded, its extra rows dropped).
    prompt_len: P, the static prompt width.
    max_new_tokens: response cap.
    tau: diffusion commit threshold.
    max_steps_per_block: diffusion denoising-step cap per block.
    out_path: JSONL with one row per example (user, response text, ranking, validity, target
      rank), or None.
    desc: progress-bar label.
    constrained: decode with the answer constraint (diffusion models only; an ablation).
    commit_order: the diffusion commit order (decode_batch).
    given_reasoning: give each example's own reasoning tokens (teacher forcing; the split must
      carry reasoning, e.g. 'train') and decode only the answer after them (diffusion only).

  Returns:
    score(...) plus 'mean_response_len', 'mean_nfe' and 'nfe_per_token' (forwards incl. prefill
    and commit forwards), 'paper_nfe_per_token' (denoising steps per token, the paper's count),
    'tokens_per_s' (after the first, compiling batch) and 'seconds'.
  """
  results, rows, lengths, nfes, steps = [], [], [], [], []
  decode_s, decoded_tokens = 0.0, 0
  start = time.perf_counter()
  bar = progress(len(data), desc=desc)
  for first in range(0, len(data), batch_size):
    chunk = data.encoded[first:first + batch_size]
    prompts, prompt_lengths = inputs.prompt_arrays(chunk, batch_size, prompt_len,
                                                   config.pad_token_id)
    constraint = None
    if constrained:
      labels = np.stack([e.label_tokens for e in chunk])
      labels = np.concatenate([labels, np.repeat(labels[-1:], batch_size - len(chunk), 0)])
      constraint = answer_constraint(tokenizer, config, labels)
    prefix = None
    if given_reasoning:
      if not all(len(e.reasoning) for e in chunk):
        raise ValueError("evaluate: given_reasoning needs a split whose examples carry reasoning "
                         "(validation / test have none; use 'train')")
      width = max(len(e.reasoning) for e in chunk)
      given = np.zeros((batch_size, width), np.int32)
      given_lengths = np.zeros((batch_size,), np.int32)
      for i in range(batch_size):
        reasoning = chunk[min(i, len(chunk) - 1)].reasoning
        given[i, :len(reasoning)] = reasoning
        given_lengths[i] = len(reasoning)
      prefix = (given, given_lengths)
    t0 = time.perf_counter()
    out = decode_batch(params, config, prompts, prompt_lengths, max_new_tokens=max_new_tokens,
                       tau=tau, max_steps_per_block=max_steps_per_block, constraint=constraint,
                       commit_order=commit_order, response_prefix=prefix)
    jax.block_until_ready(out["tokens"])
    if first > 0:
      decode_s += time.perf_counter() - t0
      decoded_tokens += int(out["lengths"][:len(chunk)].sum())
    texts = response_texts(tokenizer, out["tokens"][:len(chunk)], out["lengths"][:len(chunk)])
    for i, text in enumerate(texts):
      index = first + i
      result = answer.parse_answer(text, data.labels[index])
      results.append(result)
      rows.append({"user": int(data.users[index]), "response": text, "kind": result.kind,
                   "ranking": result.ranking.tolist(),
                   "target_position": int(data.encoded[index].target_position)})
    lengths += out["lengths"][:len(chunk)].tolist()
    nfes += out["nfe"][:len(chunk)].tolist()
    steps += out["denoise_steps"][:len(chunk)].tolist()
    bar.update(len(chunk))
  bar.close()
  out = score(results, data)
  out["mean_response_len"] = float(np.mean(lengths))
  out["mean_nfe"] = float(np.mean(nfes))
  out["nfe_per_token"] = float(np.sum(nfes) / max(np.sum(lengths), 1))
  out["paper_nfe_per_token"] = float(np.sum(steps) / max(np.sum(lengths), 1))
  out["tokens_per_s"] = decoded_tokens / decode_s if decode_s > 0 else None
  out["seconds"] = time.perf_counter() - start
  if out_path is not None and jax.process_index() == 0:
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    ranks = metrics_lib.target_ranks(np.stack([r.ranking for r in results]),
                                     data.target_position[:len(results)])
    with open(out_path, "w") as f:
      for row, rank in zip(rows, ranks, strict=True):
        f.write(json.dumps({**row, "target_rank": int(rank)}) + "\n")
  return out


def format_result(name: str, result: dict) -> str:
  """One readable line of an evaluation result."""
  counts = " ".join(f"{k}={v}" for k, v in result["counts"].items() if k != "valid" and v)
  teacher = result["top1_is_teacher"]
  return (f"{name}: R@1 {result['R@1']:.4f} (se {result['R@1_se']:.4f}) R@3 {result['R@3']:.4f} "
          f"N@3 {result['N@3']:.4f} | valid {result['valid_rate']:.3f} {counts} | top1=D "
          f"{result['top1_is_D_first']:.3f}"
          + (f" top1=teacher {teacher:.3f}" if teacher is not None else "")
          + f" | len {result['mean_response_len']:.1f} fwd/tok {result['nfe_per_token']:.3f}"
          + f" steps/tok {result['paper_nfe_per_token']:.3f}"
          + (f" {result['tokens_per_s']:.0f} tok/s" if result["tokens_per_s"] else "")
          + f" | n={result['num']} {result['seconds']:.0f} s")
