r"""Answer validity of CFT models without a constrained decoder: decode-side causes.

  python experiments/studies/cft_validity.py --workdir=W --ckpt=W/cft/export \
      --specs=1.0:confidence:32,1.0:left_to_right:32,0.9:confidence:32 --out=OUT.json

Each spec TAU:ORDER:B[:given] decodes --split (default the 1,615 users) with the checkpoint's
weights at block size B (the checkpoint's own B or another), commit threshold TAU and commit
order ORDER (gr2jax/diffusion/commit.py: 'confidence' = the paper's, 'left_to_right' = AR order
inside a block, 'distinct' = no token new to the block committed at two places by one step);
':given' gives each user's own reasoning (teacher forcing; only splits that carry reasoning:
--split=train --limit=1615) and decodes the answer after it. All through the one evaluation
(decoding/evaluation.evaluate) and reports the valid rate, the invalid kinds, R@1 and the wall
time. Per spec it also splits validity by where the answer starts relative to the block
boundaries (response tokens before `{"ranking"` modulo B) and by the reasoning length (tokens),
from the decoded responses. W is read only (its summary.json paths). Every --specs entry is
checked before anything is loaded (TAU in (0, 1], ORDER one of commit.ORDERS, B an integer >= 1),
--limit when absl parses it (>= 0, 0 = all). An export trained on another data build than W's
(another tokenizer or other semantic IDs) is refused by name before its weights load, by the
check eval.py makes (exports.check_data_build; experiments/export_reads.py `check_build`).
Prints a markdown table and writes every row to --out (JSON).
"""

import collections
import dataclasses
import json
import os
import time
from typing import NamedTuple

import numpy as np
from absl import app, flags, logging

from experiments import export_reads
from gr2jax import cli
from gr2jax.decoding import evaluation
from gr2jax.decoding import policy as policy_lib
from gr2jax.decoding import reranker as reranker_lib
from gr2jax.decoding.spec import DecodeSpec
from gr2jax.diffusion import commit

FLAGS = flags.FLAGS


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """The command line's flags (defined only when run as a script: tests import this module)."""
  f = {"flag_values": flag_values}
  flags.DEFINE_string("workdir", None, "A Table 2 workdir (its data build; read only).", **f)
  flags.DEFINE_string("ckpt", None, "A diffusion export (e.g. W/cft/export).", **f)
  flags.DEFINE_list("specs", ["1.0:confidence:32", "1.0:left_to_right:32", "0.9:confidence:32",
                              "0.9:left_to_right:32"], "TAU:ORDER:B decodes.", **f)
  flags.DEFINE_string("split", "test_1615", "Evaluated split.", **f)
  flags.DEFINE_integer("limit", 0, "First N users only (0 = all).", lower_bound=0, **f)
  flags.DEFINE_string("out", None, "JSON of every row.", **f)
  flags.mark_flags_as_required(["workdir", "ckpt", "out"], flag_values=flag_values)


SPEC_FORM = "TAU:ORDER:B or TAU:ORDER:B:given, e.g. 0.9:confidence:32"


class Spec(NamedTuple):
  """One --specs entry: its text, how it decodes and whether the reasoning is given."""
  text: str
  decode: DecodeSpec
  given: bool


def _spec_problem(fields: list[str]) -> str | None:
  """What is wrong with the fields of a --specs entry (TAU:ORDER:B[:given]), else None."""
  if len(fields) not in (3, 4):
    return f"has {len(fields)} field{'s' * (len(fields) != 1)}, not 3 or 4"
  tau, order, block, *given = fields
  if given not in ([], ["given"]):
    return f"its 4th field is {given[0]!r}, not 'given'"
  try:
    tau_value = float(tau)
  except ValueError:
    return f"TAU {tau!r} is not a number"
  if not 0 < tau_value <= 1:
    return f"TAU {tau} is not in (0, 1]"
  if order not in commit.ORDERS:
    return f"ORDER {order!r} is not one of {', '.join(commit.ORDERS)}"
  if not block.isdigit() or int(block) < 1:
    return f"B {block!r} is not an integer >= 1"
  return None


def parse_spec(text: str) -> Spec:
  """A --specs entry TAU:ORDER:B[:given] as a Spec (checked before anything is loaded).

  Raises:
    app.UsageError: naming --specs, the entry, what is wrong and the expected form.
  """
  fields = text.split(":")
  problem = _spec_problem(fields)
  if problem:
    raise app.UsageError(f"--specs: {text!r} {problem}; expected {SPEC_FORM}")
  decode = DecodeSpec(block_size=int(fields[2]), eval_tau=float(fields[0]),
                      commit_order=fields[1])
  return Spec(text, decode, fields[3:] == ["given"])


def answer_offsets(tok, rows: list[dict]) -> tuple[np.ndarray, np.ndarray]:
  """(tokens before the answer JSON, valid) per decoded response; -1 where there is no JSON."""
  before, valid = [], []
  for row in rows:
    text = row["response"]
    cut = text.find(export_reads.ANSWER_START)
    before.append(-1 if cut < 0 else len(tok.encode(text[:cut], add_special_tokens=False)))
    valid.append(row["kind"] == "valid")
  return np.asarray(before), np.asarray(valid)


def by_group(keys: np.ndarray, valid: np.ndarray) -> dict:
  """{key: [count, valid rate]} over the rows of each key."""
  out = {}
  for key in sorted(set(keys.tolist())):
    sel = keys == key
    out[str(key)] = [int(sel.sum()), float(valid[sel].mean())]
  return out


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  specs = [parse_spec(text) for text in FLAGS.specs]
  config, params, tok, data, prompt_len, response_len = export_reads.read_diffusion(
    FLAGS.ckpt, FLAGS.workdir, FLAGS.split, FLAGS.limit)
  out_dir = os.path.dirname(os.path.abspath(FLAGS.out))
  rows = []
  for spec in specs:
    decode, block = spec.decode, spec.decode.block_size
    cfg = dataclasses.replace(config, block_size=block)
    policy = policy_lib.make_policy(cfg, decode, response_len)
    jsonl = os.path.join(out_dir, f"decode_{FLAGS.split}_{spec.text.replace(':', '_')}.jsonl")
    start = time.perf_counter()
    result = evaluation.evaluate(reranker_lib.Reranker.of(policy, params, tok, prompt_len), data,
                                 batch_size=256, out_path=jsonl, desc=spec.text,
                                 given_reasoning=spec.given)
    decoded = [json.loads(line) for line in open(jsonl)]
    before, valid = answer_offsets(tok, decoded)
    counts = collections.Counter(result["counts"])
    row = dict(ckpt=FLAGS.ckpt, split=FLAGS.split, tau=decode.eval_tau, order=decode.commit_order,
               block=block, reasoning="given" if spec.given else "generated",
               valid_rate=result["valid_rate"], duplicate=counts["duplicate"],
               out_of_set=counts["out_of_set"],
               other_invalid=sum(v for k, v in counts.items()
                                 if k not in ("valid", "duplicate", "out_of_set")),
               R1=result["R@1"], R1_se=result["R@1_se"], nfe_per_token=result["nfe_per_token"],
               seconds=time.perf_counter() - start,
               valid_by_answer_offset=by_group(np.where(before < 0, -1, before % block), valid),
               valid_by_reasoning_tokens=by_group(before, valid))
    print(json.dumps(row), flush=True)
    rows.append(row)
  with open(FLAGS.out, "w") as f:
    json.dump(rows, f, indent=1)
  cols = ("split", "tau", "order", "block", "reasoning", "valid_rate", "duplicate", "out_of_set",
          "other_invalid", "R1", "nfe_per_token", "seconds")
  print("| " + " | ".join(cols) + " |\n|" + "---|" * len(cols))
  for r in rows:
    print("| " + " | ".join(f"{r[c]:.4g}" if isinstance(r[c], float) else str(r[c])
                            for c in cols) + " |")


if __name__ == "__main__":
  define_flags()
  cli.run(main)
