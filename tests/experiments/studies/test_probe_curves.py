"""experiments/studies/probe_curves.py: probe rows read from a stage's metrics file, the summary
table, the plot, and the refusals naming the flag or the file."""

import json
import os

import pytest

from experiments.studies import probe_curves


def _stage_dir(root, rows) -> str:
  logs = os.path.join(root, "logs")
  os.makedirs(logs)
  with open(os.path.join(logs, "metrics.jsonl"), "w") as f:
    for row in rows:
      f.write(json.dumps(row) + "\n")
  return str(root)


def test_probe_rows_become_curves_and_a_table(tmp_path):
  stage = _stage_dir(tmp_path / "a", [
    {"step": 0, "probe/reward": -0.5, "probe/valid_rate": 0.5},
    {"step": 1, "train/loss": 3.0},
    {"step": 10, "probe/reward": 0.1, "probe/valid_rate": 0.9},
    {"step": 10, "probe/reward": 0.2},  # a resumed run probed step 10 again: the last row wins
  ])
  curves = probe_curves.read_curves(stage)
  assert curves == {"reward": [[0, -0.5], [10, 0.2]], "valid_rate": [[0, 0.5], [10, 0.9]]}
  table = probe_curves.summary_table({"a": curves})
  assert "| a | reward | -0.5000 (0) | 0.2000 (10) | +0.7000 |" in table
  probe_curves.plot({"a": curves}, ["reward", "valid_rate"], str(tmp_path / "c.png"))
  assert os.path.getsize(tmp_path / "c.png") > 0


def test_a_run_keeps_its_colour_in_a_panel_the_run_before_it_lacks(tmp_path, monkeypatch):
  """A run without one metric (an older probe) leaves that panel, not its colour to the next
  run: every line of a run is drawn in the run's own colour."""
  import matplotlib.axes

  drawn = []
  original = matplotlib.axes.Axes.plot
  monkeypatch.setattr(matplotlib.axes.Axes, "plot", lambda ax, *a, **k: (
    drawn.append((ax.get_title() or "?", k["label"], k["color"])), original(ax, *a, **k))[1])
  curves = {"old": {"loss": [[0, 1.0], [10, 0.5]]},
            "new": {"loss": [[0, 1.0], [10, 0.4]], "deployed_valid_rate": [[0, 0.8], [10, 0.9]]}}
  probe_curves.plot(curves, ["loss", "deployed_valid_rate"], str(tmp_path / "c.png"))
  colours = {}
  for _, run, colour in drawn:
    assert colours.setdefault(run, colour) == colour
  assert colours == probe_curves.run_colours(curves) == {"old": "C0", "new": "C1"}
  assert [run for _, run, _ in drawn] == ["old", "new", "new"]


def test_refusals_name_the_flag_or_the_file(tmp_path):
  with pytest.raises(ValueError, match="--runs: 'x' is not NAME=STAGE_DIR"):
    probe_curves.parse_runs(["x"])
  with pytest.raises(ValueError, match="--runs: 'a' is named twice"):
    probe_curves.parse_runs(["a=1", "a=2"])
  with pytest.raises(FileNotFoundError, match="no metrics file"):
    probe_curves.read_curves(str(tmp_path))
  stage = _stage_dir(tmp_path / "b", [{"step": 1, "train/loss": 1.0}])
  with pytest.raises(ValueError, match="no probe/\\* rows; run the stage with"):
    probe_curves.read_curves(stage)
