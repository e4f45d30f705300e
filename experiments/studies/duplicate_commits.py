r"""Where a diffusion model's duplicate answers come from: one denoising step, or two.

  python experiments/studies/duplicate_commits.py --workdir=W --ckpt=W/rl/export \
      --split=validation \
      --limit=2000 --tau=0.9 --order=confidence --out=OUT.json

Decodes --split with the checkpoint's own decoder (greedy, commit threshold --tau, commit order
--order, no constraint) and, for every answer that names a candidate twice (answer.parse_answer's
'duplicate'), reads the decoder's trace: the denoising step and block in which each answer-span
occurrence of the repeated label was committed. `same_step`: two occurrences were committed by one
forward (the parallel commit of places that cannot see each other); `other_steps`: each was
committed by another step, so the later one was written with the earlier one in view. W is read only
(its summary.json paths); an export trained on another data build than W's is refused by name before
its weights load (experiments/export_reads.py check_build, eval.py's check). Every flag is checked
when absl parses it (--limit >= 0, --batch_size >= 1, --tau in (0, 1]). Prints the counts as JSON
and a markdown table, writes them to --out.
"""

import collections
import json

import numpy as np
from absl import flags, logging

from experiments import export_reads
from gr2jax import cli
from gr2jax.decoding import policy as policy_lib
from gr2jax.decoding import prompt_io
from gr2jax.decoding import reranker as reranker_lib
from gr2jax.decoding.spec import DecodeSpec
from gr2jax.diffusion import commit, decode

FLAGS = flags.FLAGS


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """The command line's flags (defined only when run as a script: tests import the module
  beside other absl mains)."""
  f = {"flag_values": flag_values}
  flags.DEFINE_string("workdir", None, "The workdir of the checkpoint's data build (read only).",
                      **f)
  flags.DEFINE_string("ckpt", None, "A block-diffusion export (e.g. W/rl/export).", **f)
  flags.DEFINE_string("split", "validation", "Decoded split.", **f)
  flags.DEFINE_integer("limit", 2000, "First N users only (0 = all).", lower_bound=0, **f)
  cli.define("tau", 0.9, "Commit threshold.", cli.number(0, 1, low_open=True), **f)
  flags.DEFINE_enum("order", "confidence", commit.ORDERS,
                    "Commit order (gr2jax/diffusion/commit.py; 'confidence' = the paper's).", **f)
  flags.DEFINE_integer("batch_size", 256, "Decode batch size.", lower_bound=1, **f)
  flags.DEFINE_string("out", None, "JSON of the counts.", **f)
  flags.mark_flags_as_required(["workdir", "ckpt", "out"], flag_values=flag_values)


def occurrences(tokens: np.ndarray, label: np.ndarray, start: int) -> list[int]:
  """Positions p >= start where tokens[p:p + len(label)] == label."""
  n = len(label)
  return [p for p in range(start, len(tokens) - n + 1) if np.array_equal(tokens[p:p + n], label)]


def repeat_kind(tokens: np.ndarray, steps: np.ndarray, labels: np.ndarray, start: int,
                block_size: int) -> str | None:
  """'same_step' if two answer-span occurrences of one label were committed by one denoising step
  of one block, 'other_steps' if a label repeats but never so, None if none repeats.

  Args:
    tokens: [R] the response.
    steps: [R] each response token's denoising step within its block (the decoder's trace).
    labels: [N, Lc] the candidates' label tokens.
    start: the answer's first response index (occurrences before it, in the reasoning, are not
      the ranking's).
    block_size: B (response index // B is a token's block).
  """
  kind = None
  for label in labels:
    where = occurrences(tokens, label, start)
    if len(where) < 2:
      continue
    kind = "other_steps"
    commits = [(p // block_size, int(steps[p])) for p in where]
    if len(set(commits)) < len(commits):
      return "same_step"
  return kind


def answer_start(tok, tokens: np.ndarray) -> int:
  """The response index of the token that completes the answer JSON's opening (len(tokens) when
  there is none): read off the decoded prefixes, so token merges cannot shift it."""
  for p in range(len(tokens)):
    if export_reads.ANSWER_START in tok.decode(tokens[:p + 1].tolist(), skip_special_tokens=False):
      return p
  return len(tokens)


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  config, params, tok, data, prompt_len, response_len = export_reads.read_diffusion(
    FLAGS.ckpt, FLAGS.workdir, FLAGS.split, FLAGS.limit)
  policy = policy_lib.make_policy(config, DecodeSpec(block_size=config.block_size,
                                                     eval_tau=FLAGS.tau,
                                                     commit_order=FLAGS.order), response_len)
  params = policy.decoding_params(params)
  counts = collections.Counter()
  for first in range(0, len(data), FLAGS.batch_size):
    chunk = data.encoded[first:first + FLAGS.batch_size]
    prompts, lengths = prompt_io.prompt_arrays(chunk, FLAGS.batch_size, prompt_len,
                                               config.pad_token_id)
    out = decode.block_diffusion_generate(params, config, prompts, lengths,
                                          policy.decoding(FLAGS.tau))
    tokens, steps, sizes = (np.asarray(x) for x in (out.tokens, out.commit_step, out.lengths))
    _, results = reranker_lib.read_answers(tok, tokens[:len(chunk)], sizes[:len(chunk)],
                                           data.labels[first:first + len(chunk)])
    for i, result in enumerate(results):
      kind = result.kind
      counts[kind] += 1
      if kind == "duplicate":
        n = int(sizes[i])
        counts["duplicate_" + (repeat_kind(tokens[i, :n], steps[i, :n], chunk[i].label_tokens,
                                           answer_start(tok, tokens[i, :n]), config.block_size)
                               or "unlocated")] += 1
  row = dict(ckpt=FLAGS.ckpt, split=FLAGS.split, users=len(data), tau=FLAGS.tau,
             order=FLAGS.order, **counts)
  print(json.dumps(row), flush=True)
  with open(FLAGS.out, "w") as f:
    json.dump(row, f, indent=1)
  cols = ("users", "tau", "order", "valid", "duplicate", "duplicate_same_step",
          "duplicate_other_steps", "duplicate_unlocated")
  print("| " + " | ".join(cols) + " |\n|" + "---|" * len(cols))
  print("| " + " | ".join(str(row.get(c, 0)) for c in cols) + " |")


if __name__ == "__main__":
  define_flags()
  cli.run(main)
