"""experiments/studies/cft_scale.py: the rise fit, a point read from a chain workdir's files, the
budgets and the plot. The chains themselves are runs, not tests."""

import json
import math
import os

import pytest

from experiments.studies import cft_scale
from gr2jax import exports
from gr2jax.model import params as params_lib
from gr2jax.model.config import ModelConfig


def test_rise_halving_invalid_per_doubling():
  fit = cft_scale.rise([1_000_000, 2_000_000], [0.5, 0.75])
  assert fit["exponent"] == pytest.approx(-1.0)
  assert fit["valid_gain_per_doubling"] == pytest.approx(0.125)  # 0.25 -> 0.125 invalid
  assert fit["params_for_goal"] == pytest.approx(25_000_000)  # 0.5 * 1e6 / p = 0.02


def test_rise_without_fall_has_no_goal_and_needs_two_sizes():
  assert cft_scale.rise([1, 2, 4], [0.8, 0.8, 0.7])["params_for_goal"] is None
  with pytest.raises(ValueError, match="2 distinct sizes"):
    cft_scale.rise([5, 5], [0.5, 0.6])


def _workdir(root, name: str, config: ModelConfig, valid: tuple[float, float],
             cft_steps: int = 300) -> str:
  w = os.path.join(root, name)
  for stage, step in (("sft", 300), ("ar_rl", 1), ("cft", cft_steps)):
    os.makedirs(os.path.join(w, stage))
    json.dump({"step": step, "valid_rate": valid[0], "R@1": 0.4, "seconds": 10.0,
               "nfe_per_token": 1.0, "counts": {"duplicate": 7, "out_of_set": 2}},
              open(os.path.join(w, stage, "eval_final.json"), "w"))
    json.dump({"digest": "x", "seconds": 60.0}, open(os.path.join(w, stage, "done.json"), "w"))
  os.makedirs(os.path.join(w, "cft", "export"))
  json.dump(exports.config_to_dict(config),
            open(os.path.join(w, "cft", "export", exports.CONFIG_FILE), "w"))
  json.dump([{"tau": 0.9, "valid_rate": valid[1], "duplicate": 3, "out_of_set": 1, "R1": 0.39,
              "nfe_per_token": 0.4, "seconds": 5.0}], open(os.path.join(w, "tau09.json"), "w"))
  return w


def test_points_fits_and_plot(tmp_path):
  tiny, wide = ModelConfig.tiny(vocab_size=256), ModelConfig.tiny_wide(vocab_size=256)
  points = [cft_scale.read_point(_workdir(tmp_path, "a", tiny, (0.6, 0.5))),
            cft_scale.read_point(_workdir(tmp_path, "b", wide, (0.8, 0.75))),
            cft_scale.read_point(_workdir(tmp_path, "c", tiny, (0.9, 0.85), cft_steps=1000))]
  assert points[1]["params"] == params_lib.param_count(wide)
  assert (points[1]["layers"], points[1]["hidden"]) == (2, 256)
  assert points[0]["steps"] == {"sft": 300, "ar_rl": 1, "cft": 300}
  assert points[0]["taus"]["0.9"]["valid"] == 0.5 and points[0]["taus"]["1.0"]["duplicate"] == 7
  by_budget = {(f["steps"]["cft"], f["tau"]): f for f in cft_scale.fits(points)}
  assert by_budget[(1000, "1.0")]["fit"] is None  # one size: no rise
  fit = by_budget[(300, "0.9")]["fit"]
  assert fit["exponent"] == pytest.approx(
    math.log(0.25 / 0.5) / math.log(points[1]["params"] / points[0]["params"]))
  cft_scale.plot(points, str(tmp_path / "scale.png"))
  assert os.path.getsize(tmp_path / "scale.png") > 0


def test_missing_tau09_names_the_file(tmp_path):
  w = _workdir(tmp_path, "a", ModelConfig.tiny(vocab_size=256), (0.6, 0.5))
  os.remove(os.path.join(w, "tau09.json"))
  with pytest.raises(FileNotFoundError, match="tau09.json"):
    cft_scale.read_point(w)
