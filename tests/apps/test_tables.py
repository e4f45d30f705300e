"""Table 3 / Figure 6 / Table 4 (gr2jax/apps/tables.py): the reasoning checks on hand-written
responses, and every table and figure produced from tiny random AR and diffusion models."""

import dataclasses
import functools
import json
import os
import types

import numpy as np
import pytest

from gr2jax import metrics, recipe, recipes
from gr2jax.apps import report, tables
from gr2jax.data import prompts
from gr2jax.data import tokenizer as tokenizer_lib
from gr2jax.decoding import evaluation
from gr2jax.decoding import reranker as reranker_lib
from gr2jax.decoding.policy import make_policy
from gr2jax.decoding.spec import DecodeSpec
from tests.apps.test_rerank import _model
from tests.data.toy_records import toy_catalog, toy_example, toy_sids
from tests.train.toy import PROMPT, toy_lengths, toy_split, toy_tokenizer

USERS = range(100, 108)


def _record(user, prompt=PROMPT):
  ex = toy_example(user=user, with_teacher=False)
  labels = prompts.candidate_labels(ex, toy_sids(), prompt)
  return {"history": ex.history, "candidates": ex.candidates, "evidence": ex.evidence,
          "labels": labels}


def _answer(labels):
  return prompts.render_answer(np.arange(10), labels)


def test_terse_flags_checks():
  record = _record(100)
  ev = record["evidence"]
  hit = int(np.argmax(ev[:, 0] > 0))  # a slot with a brand match
  miss = int(np.argmax(ev[:, 1] == 0))  # a slot without a leaf match
  text = (prompts.think_block(f"<slot_{hit}><brand_{ev[hit, 0]}>\n<slot_{miss}><leaf_1>")
          + _answer(record["labels"]))
  c = tables.reasoning_checks(text, record, PROMPT, toy_catalog(), None)
  assert c == {"ids_ok": True, "history_as_candidate": False, "citations": 2, "grounded": 1,
               "lines": 2, "parsed": True, "valid": True}
  c = tables.reasoning_checks(prompts.think_block("H1<brand_1>") + "{oops", record, PROMPT,
                              toy_catalog(), None)
  assert c["history_as_candidate"] and not c["ids_ok"] and not c["parsed"]


def test_chat_citations_grounded_only_when_true():
  chat = dataclasses.replace(PROMPT, style="chat", evidence="raw")
  record = _record(101, chat)
  catalog = toy_catalog()
  slot = int(np.argmax(record["evidence"][:, 0] > 0))
  brand = catalog.brands[int(record["candidates"][slot])]
  other = next(b for b in ("Revlon", "Maybelline") if b != brand)
  text = prompts.think_block(f"<slot_{slot}> brand {brand}: H1\n<slot_{slot}> brand {other}")
  c = tables.reasoning_checks(text + _answer(record["labels"]), record, chat, catalog, None)
  assert c["citations"] == 2 and c["grounded"] == 1 and c["ids_ok"]


def test_sid_labels_must_be_in_history_or_candidates():
  sid_prompt = dataclasses.replace(PROMPT, answer_format="sid")
  record = _record(102, sid_prompt)
  sids = toy_sids()
  hist_sid = prompts.sid_string(sids[record["history"][0]])
  outside = next(i for i in range(40) if i not in set(record["history"].tolist())
                 | set(record["candidates"].tolist()))
  good = prompts.think_block(f"{record['labels'][3]}<brand_1>: {hist_sid}")
  c = tables.reasoning_checks(good + _answer(record["labels"]), record, sid_prompt,
                              toy_catalog(), sids)
  assert c["ids_ok"] and c["citations"] == 1
  bad = prompts.think_block(f"{prompts.sid_string(sids[outside])}<brand_1>")
  c = tables.reasoning_checks(bad, record, sid_prompt, toy_catalog(), sids)
  assert not c["ids_ok"] and not c["history_as_candidate"]
  as_candidate = prompts.think_block(f"{hist_sid}<brand_1>")
  c = tables.reasoning_checks(as_candidate, record, sid_prompt, toy_catalog(), sids)
  assert c["history_as_candidate"] and not c["ids_ok"]
  c = tables.reasoning_checks(prompts.think_block("<a_1><b_2>"), record, sid_prompt,
                              toy_catalog(), sids)
  assert not c["ids_ok"]  # a partial SID is not an identifier of H or D


@pytest.mark.parametrize("style,answer_format", [("terse", "slot"), ("chat", "slot"),
                                                 ("chat", "sid")])
def test_teacher_reasoning_is_correct_and_grounded(style, answer_format):
  """The rule teacher's rendered traces pass every check (citations are true by construction)."""
  prompt = dataclasses.replace(PROMPT, style=style, answer_format=answer_format,
                               history_items=8 if style == "chat" else 0)
  catalog, sids = toy_catalog(), toy_sids()
  records = []
  for user in range(12):
    ex = toy_example(user=user)
    ev = ex.evidence.copy()
    for c in ex.citations:  # the toy citations need the matches they claim
      ev[c.slot, prompts.EVIDENCE_KINDS.index(c.kind)] = 2
    item = int(ex.candidates[2])
    catalog = dataclasses.replace(catalog, brands=tuple(
      "Maybelline" if i == item else b for i, b in enumerate(catalog.brands)))
    ex = dataclasses.replace(ex, evidence=ev)
    if style == "chat":  # slot 5 cites leaf Mascara
      cats = list(catalog.categories)
      cats[int(ex.candidates[5])] = ("Beauty", "Makeup", "Mascara")
      catalog = dataclasses.replace(catalog, categories=tuple(cats))
    r = prompts.render_example(ex, catalog, sids, prompt)
    records.append({"history": ex.history, "candidates": ex.candidates, "evidence": ev,
                    "labels": r.labels, "reasoning": r.reasoning, "answer": r.answer})
  inp = tables.Inputs(None, None, [], 0, 0, prompt, catalog, sids)
  inp = dataclasses.replace(inp, tokenizer=lambda texts, **_: {"input_ids": [t.split()
                                                                             for t in texts]})
  row = tables.teacher_row(inp, records)
  assert row["identifier_correct"] == row["parse_rate"] == row["valid_rate"] == 1.0
  assert row["with_citations"] == 1.0 and row["grounded_citations"] == 1.0


def test_bin_edges_and_speedup_bins():
  np.testing.assert_array_equal(tables.bin_edges(np.full(5, 57), 4), [57, 58])
  by = np.asarray([10, 10, 20, 40])
  ar = {"seconds": np.asarray([2.0, 2.0, 4.0, 8.0]), "forwards": np.asarray([10, 10, 20, 40]),
        "output_len": by}
  diff = {"seconds": np.asarray([1.0, 1.0, 1.0, 2.0]), "forwards": np.asarray([3, 3, 5, 9]),
          "output_len": by}
  bins = tables.speedup_bins(ar, diff, by, 2)
  assert sum(b["num"] for b in bins) == 4
  assert bins[-1]["speedup_time"] == pytest.approx((8 / 40) / (2 / 40))


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
  out = str(tmp_path_factory.mktemp("tok"))
  toy_tokenizer(out)
  tok = tokenizer_lib.load_tokenizer(out)
  data = dataclasses.replace(toy_split(tok, USERS, with_teacher=False),
                             source="toy:test:8")  # the tables read through the eval cache
  p, r = toy_lengths([toy_split(tok, range(24)), toy_split(tok, USERS)])
  inp = tables.Inputs(tok, data, [_record(u) for u in USERS], p, min(r, 16), PROMPT,
                      toy_catalog(), None)
  models = {name: tables.Model(name, *_model(tok, name == "diffusion"))
            for name in ("ar", "diffusion")}
  models["lossless"] = tables.Model(
    "pair", models["diffusion"].config,
    {"drafter": models["diffusion"].params, "verifier": models["ar"].params},
    models["ar"].config)
  return inp, models


@pytest.mark.slow  # ~35 s on 2 busy cores: AR and diffusion evaluations + batch-1 timings
def test_tables_and_figure_from_toy_models(toy, tmp_path):
  inp, models = toy
  workdir = str(tmp_path)
  table = recipe.tables_config(recipes.get("tiny"), "table3", workdir)  # with toy sizes
  table = dataclasses.replace(
    table, fig6=table.fig6.replace(tau=0.9, limit=4, num_bins=2, output_lengths=(8, 24),
                                   sweep_examples=2),
    eval=dataclasses.replace(table.eval, batch_size=4), taus=(1.0, 0.5),
    commit_orders=("confidence", "distinct"), full_split_taus=(0.5,), speed_examples=2,
    remeasure=False, lossless_drafts=((4, 0.0),),
    decode=DecodeSpec(max_steps_per_block=4, draft_k=4))
  rows = tables.table3_rows(models, inp, table, workdir)
  assert [(r["tau"], r["order"]) for r in rows] == [
    (None, None), (1.0, "confidence"), (1.0, "distinct"), (0.5, "confidence"),
    (0.5, "distinct"), (None, None)]
  lossless = rows[5]  # the AR model's own answers, at another speed
  assert lossless["row"].startswith("Draft + verify") and all(
    lossless[k] == rows[0][k] for k in ("R@1", "R@3", "N@3", "valid_rate"))
  assert rows[0]["speedup"] == pytest.approx(1.0) and rows[0]["b1_speedup"] == 1.0
  assert all(r["tokens_per_s"] and r["b1_tokens_per_s"] and r["num"] == len(USERS)
             for r in rows)
  assert rows[0]["paper"].startswith("0.2960") and rows[3]["paper"] is None
  md = tables.markdown(rows, tables.TABLE3_COLUMNS)
  assert md.count("\n") == 2 + len(rows) and "| row | order | tau | R@1 |" in md
  cached = sorted(os.listdir(evaluation.cache_dir(workdir)))
  assert sum("_tau0.5_distinct_" in name for name in cached) == 2  # its .json and .jsonl
  table = dataclasses.replace(table, speed_examples=0)
  assert tables.table3_rows(models, inp, table, workdir)[3]["R@1"] == rows[3]["R@1"]
  # the full-split pairs: its tau 0.5 (the recipe's order), tau 1.0 and AR rows are the rows'
  full = tables.full_split_rows(models, inp, table, workdir)
  assert sorted(os.listdir(evaluation.cache_dir(workdir))) == cached  # nothing decoded again
  assert [(e["tau"], e["order"], e["versus"]) for e in full] == [
    (0.5, "confidence", "Diffusion-GR2 tau 1"), (0.5, "confidence", "AR GR2")]
  assert full[0]["R@1"] == rows[3]["R@1"] and full[0]["versus_R@1"] == rows[1]["R@1"]
  assert full[1]["versus_nfe_per_token"] == rows[0]["nfe_per_token"]
  tables.frontier_png(rows, str(tmp_path / "frontier.png"))
  assert os.path.getsize(tmp_path / "frontier.png") > 1000

  _, eval_rows = tables.evaluate_at("diffusion", models["diffusion"], table, inp, workdir)
  row = tables.table4_row("Diffusion-GR2", eval_rows, inp)
  assert row["num"] == len(USERS) and 0 <= row["identifier_correct"] <= 1
  assert set(tables.TABLE4_COLUMNS) <= set(row)

  data = tables.fig6(models, inp, table)
  assert data["num"] == 4 and data["by_output_length"] and data["by_prompt_length"]
  assert [b["mean"] for b in data["by_forced_output_length"]] == [8, 24]  # no stop: exact
  assert sum(b["num"] for b in data["by_prompt_length"]) == 4
  assert data["overall"]["speedup_time"] > 0
  assert data["lossless"]["overall"]["speedup_time"] > 0 and data["lossless"]["draft_k"] == 4
  tables.fig6_png(data, str(tmp_path / "fig6.png"))
  json.dumps(data)


@pytest.mark.slow  # ~2 min on the busy 2 cores: three evaluations, two decoder compiles
def test_evaluation_decoder_options(toy):
  """evaluation.evaluate's diffusion options: commit order, given reasoning (teacher forcing)."""
  inp, models = toy
  model = models["diffusion"]
  reranker = functools.partial(reranker_lib.Reranker.of, params=model.params,
                               tokenizer=inp.tokenizer, prompt_len=inp.prompt_len)
  ltr = make_policy(model.config, DecodeSpec(commit_order="left_to_right"), inp.response_len)
  assert evaluation.evaluate(reranker(ltr), inp.data, batch_size=8)["num"] == len(USERS)
  policy = make_policy(model.config, DecodeSpec(), inp.response_len + 32)
  with pytest.raises(ValueError, match="given_reasoning needs a split whose examples carry"):
    evaluation.evaluate(reranker(policy), inp.data, batch_size=8, given_reasoning=True)
  train = toy_split(inp.tokenizer, range(8))
  given = evaluation.evaluate(reranker(policy), train, batch_size=8, given_reasoning=True)
  assert given["num"] == 8


def test_a_finished_tables_timings_are_reused_unless_remeasured(tmp_path, capsys):
  """Table 3's batch-1 timings and Figure 6 are kept per models and settings: a rerun reuses
  them and says so; table.remeasure times again."""
  calls = []

  def measure():
    calls.append(1)
    return {"b1_tokens_per_s": 10.0 * len(calls)}

  path = str(tmp_path / "ar_tau1_b1_key.json")
  assert tables.timings_cached(path, measure, remeasure=False) == {"b1_tokens_per_s": 10.0}
  assert tables.timings_cached(path, measure, remeasure=False) == {"b1_tokens_per_s": 10.0}
  assert len(calls) == 1 and f"reusing the timings in {path}" in capsys.readouterr().out
  assert tables.timings_cached(path, measure, remeasure=True) == {"b1_tokens_per_s": 20.0}
  assert json.load(open(path)) == {"b1_tokens_per_s": 20.0}


def test_table3_shows_the_invalid_kinds_and_a_rerender_keeps_the_stamp(tmp_path):
  """Table 3's columns carry each invalid-answer count (from the rows' 'counts', as Table 2's);
  a re-render with an extra column passes the saved record (stamp included) through."""
  counts = {"valid": 6, "malformed_json": 0, "duplicate": 1, "omitted": 0, "out_of_set": 0,
            "truncated": 1}
  rows = [{"row": "AR GR2", "order": None, "tau": None, "R@1": 0.5, "tokens_per_s": 10.0,
           "counts": counts}]
  stamp = {"recipe_digest": "066aafb788d55543", "commit": "0" * 40}
  table3 = {**stamp, "header": "Table 3 header", "commit_order": "distinct", "rows": rows,
            "full_split": []}
  md = tables.write_table3(table3, str(tmp_path))
  header, _, cells = md.splitlines()[2:5]
  columns = [c.strip() for c in header.strip("|").split("|")]
  values = dict(zip(columns, [c.strip() for c in cells.strip("|").split("|")], strict=True))
  assert columns[:3] == list(tables.TABLE3_FIRST) == ["row", "order", "tau"]
  assert [values[k] for k in ("duplicate", "truncated", "malformed_json")] == ["1", "1", "0"]
  assert md.splitlines()[-1] == report.stamp_line(stamp) and "Paired on" not in md
  saved = json.load(open(tmp_path / "table3.json"))
  assert saved == table3
  rows = [{**r, "extra": "x"} for r in saved["rows"]]
  md = tables.write_table3({**saved, "rows": rows}, str(tmp_path), "; extra = x", ("extra",))
  assert md.startswith("Table 3 header; extra = x\n\n") and md.splitlines()[-1].startswith(
    "recipe_digest 066aafb788d55543")
  assert report.stamp_of(json.load(open(tmp_path / "table3.json"))) == stamp


# ---- Table 3's rows and full split, on canned evaluations (no decode) ----------------------


def _canned_evaluations(monkeypatch) -> dict:
  """tables.evaluate_at replaced by canned evaluations of 20 users: each (model name, tau,
  commit order) its own target ranks. Returns {(name, tau, order): ranks} of every evaluation
  asked for, filled as they are, and the specs under 'specs'."""
  asked = {"specs": []}

  def evaluate_at(name, model, table, inp, workdir, spec=None):
    del model, table, inp, workdir
    key = (name, spec.eval_tau, spec.commit_order)
    seed = int(100 * spec.eval_tau) + len(spec.commit_order) + 1000 * (name == "ar")
    ranks = np.random.default_rng(seed).integers(1, 4, 20)  # [20] ranks 1..3
    asked[key] = ranks
    asked["specs"].append((name, spec))
    result = {"R@1": float(np.mean(ranks == 1)), "valid_rate": 1.0 - seed / 1e4,
              "nfe_per_token": seed / 100, "tokens_per_s": 10.0}
    return result, [{"user": 100 + i, "target_rank": int(r)} for i, r in enumerate(ranks)]

  monkeypatch.setattr(tables, "evaluate_at", evaluate_at)
  return asked


CANNED_MODELS = dict.fromkeys(("ar", "diffusion", "lossless"))  # evaluate_at is canned


def _canned_table(tmp_path):
  table = recipe.tables_config(recipes.get("tiny"), "table3", str(tmp_path))
  return dataclasses.replace(table, taus=(1.0, 0.6), commit_orders=("distinct", "confidence"),
                             speed_examples=0, lossless_drafts=((4, 0.0),))


def _diffusion_model():
  config = types.SimpleNamespace(mask_token_id=5)
  return tables.Model("diffusion", config, {})


def test_table3_has_one_diffusion_row_per_tau_and_commit_order(tmp_path, monkeypatch):
  asked = _canned_evaluations(monkeypatch)
  table = _canned_table(tmp_path)
  assert table.decode.commit_order == "distinct"  # the tiny recipe's own order
  rows = tables.table3_rows(CANNED_MODELS, None, table, str(tmp_path))
  assert [(r["row"], r["tau"], r["order"]) for r in rows] == [
    ("AR GR2", None, None), ("Diffusion-GR2", 1.0, "distinct"),
    ("Diffusion-GR2", 1.0, "confidence"), ("Diffusion-GR2", 0.6, "distinct"),
    ("Diffusion-GR2", 0.6, "confidence"), ("Draft + verify (lossless), K=4 tau_d=0", None, None)]
  for row, (name, spec) in zip(rows, asked["specs"], strict=True):
    assert spec.commit_order == (row["order"] or table.decode.commit_order)  # AR, lossless: own
    assert spec.eval_tau == (row["tau"] or table.decode.eval_tau)
    assert name == {"AR GR2": "ar", "Diffusion-GR2": "diffusion"}.get(row["row"], "lossless")
  # each (tau, order) its own evaluation and timing names; the recipe's order named too
  names = [tables._setting_name(_diffusion_model(), spec) for name, spec in asked["specs"]
           if name == "diffusion"]
  assert names == ["tau1_distinct", "tau1_confidence", "tau0.6_distinct", "tau0.6_confidence"]
  assert rows[0]["speedup"] == rows[3]["speedup"] == 1.0  # canned: every row 10 tokens/s


def test_full_split_pairs_the_recipes_order_with_tau_1_and_ar_user_by_user(tmp_path,
                                                                          monkeypatch):
  asked = _canned_evaluations(monkeypatch)
  table = dataclasses.replace(_canned_table(tmp_path), full_split_taus=(0.6,))
  full = tables.full_split_rows(CANNED_MODELS, None, table, str(tmp_path))
  assert [(e["split"], e["tau"], e["order"], e["versus"], e["num"]) for e in full] == [
    ("test", 0.6, "distinct", "Diffusion-GR2 tau 1", 20), ("test", 0.6, "distinct", "AR GR2", 20)]
  row = asked[("diffusion", 0.6, "distinct")]
  for entry, base in zip(full, (asked[("diffusion", 1.0, "distinct")],
                                asked[("ar", 1.0, "distinct")]), strict=True):
    assert entry["paired"]["R@1"] == list(metrics.paired_bootstrap(
      metrics.recall_at_k(row, 1), metrics.recall_at_k(base, 1)))
    assert entry["paired"]["R@1"][0] == pytest.approx(np.mean(row == 1) - np.mean(base == 1))
    assert entry["R@1"] == np.mean(row == 1) and entry["versus_R@1"] == np.mean(base == 1)
  assert full[0]["valid_rate"] == full[1]["valid_rate"] != full[1]["versus_valid_rate"]
  md = tables.full_split_markdown(full)
  assert md.startswith("Paired on every user of test (n=20): Diffusion-GR2 at each tau under the "
                       "recipe's order (distinct)")
  assert md.splitlines()[2].startswith("| tau | order | versus | num | R@1 |")
  diff, lo, hi = full[1]["paired"]["R@1"]
  assert f"| {diff:+.4f} [{lo:+.4f}, {hi:+.4f}] |" in md.splitlines()[-1]


def test_write_table3_puts_the_full_split_under_the_main_table(tmp_path, monkeypatch):
  _canned_evaluations(monkeypatch)
  table = dataclasses.replace(_canned_table(tmp_path), full_split_taus=(0.6,))
  rows = tables.table3_rows(CANNED_MODELS, None, table, str(tmp_path))
  full = tables.full_split_rows(CANNED_MODELS, None, table, str(tmp_path))
  md = tables.write_table3({"header": "H", "commit_order": "distinct", "rows": rows,
                            "full_split": full}, str(tmp_path))
  assert md.endswith("\n" + tables.full_split_markdown(full))
  saved = json.load(open(tmp_path / "table3.json"))
  assert saved["commit_order"] == "distinct" and len(saved["full_split"]) == 2
  assert [r["order"] for r in saved["rows"]][1:3] == ["distinct", "confidence"]
  assert os.path.getsize(tmp_path / "table3_frontier.png") > 1000  # one line per order
