"""Run identity (gr2jax/run_identity.py): the run record, what a resume may change, the fields
added at their default or retired, the result fields a step digest covers. The step runner's
digests are pinned in tests/test_stage_registry.py (DIGESTS) and exercised in tests/test_chain.py;
the results stamp in tests/apps/test_report.py and tests/test_committed_results.py."""

import ml_collections

from gr2jax import run_identity
from gr2jax import workdir as workdir_lib


def config_of(**train):
  """A small run config (train, optimizer, eval blocks); `train` overrides train fields."""
  c = ml_collections.ConfigDict()
  c.train = ml_collections.ConfigDict(dict(steps=8, save_every=2, keep=5, micro_batches=1,
                                           batch_size=8, seed=0, restart=False) | train)
  c.optimizer = ml_collections.ConfigDict(dict(learning_rate=1e-3, schedule="cosine",
                                               total_steps=8, clip_norm=1.0))
  c.eval = ml_collections.ConfigDict(dict(batch_size=8, limit=0))
  return c


def record_of(config, **kw):
  """run_identity.run_record of `config` with a fixed data build, init and (P, R)."""
  args = dict(workdir="W", data_build={"vocab_sha256": "ab", "vocab": 3,
                                      "prompt": {"style": "terse"}},
              init_sha256="preset:tiny", lengths=(64, 48)) | kw
  return run_identity.run_record(config, **args)


def test_record_changes_that_alter_the_run_are_named():
  saved = record_of(config_of())
  assert run_identity.changed_fields(saved, record_of(config_of())) == []
  neutral = config_of(steps=20, save_every=5, keep=1, micro_batches=4)
  neutral.eval.batch_size = 2
  assert run_identity.changed_fields(saved, record_of(neutral)) == []
  assert run_identity.changed_fields(saved, record_of(config_of(), lengths=(64, 64))) == [
    ("lengths", [64, 48], [64, 64])]
  changed = config_of(batch_size=4)
  changed.optimizer.clip_norm = 0.0
  assert [f for f, _, _ in run_identity.changed_fields(saved, record_of(changed))] == [
    "optimizer.clip_norm", "train.batch_size"]
  assert [f for f, _, _ in run_identity.changed_fields(
    saved, record_of(config_of(), init_sha256="other"))] == ["init_sha256"]
  assert "train.restart" not in str(record_of(config_of(restart=True)))


def test_total_steps_matters_only_under_a_decaying_schedule():
  longer = config_of(steps=16)
  longer.optimizer.total_steps = 16
  changed = run_identity.changed_fields(record_of(config_of()), record_of(longer))
  assert [f for f, _, _ in changed] == ["optimizer.total_steps"]
  constant, longer_constant = config_of(), longer
  constant.optimizer.schedule = longer_constant.optimizer.schedule = "constant"
  assert run_identity.changed_fields(record_of(constant), record_of(longer_constant)) == []


def test_a_record_describes_the_work_not_where_the_workdir_lives(tmp_path, monkeypatch):
  """Paths inside the workdir are kept relative to it: the workdir spelt relative or absolute,
  from another directory, or a copy of it, give one record; a path elsewhere is absolute."""
  work = tmp_path / "W"
  (work / "sft").mkdir(parents=True)

  def record(workdir, init):
    config = config_of()
    config.init = init
    config.data = ml_collections.ConfigDict(dict(sids_file="sids.npy", data_dir=str(tmp_path)))
    return record_of(config, workdir=workdir)

  monkeypatch.chdir(tmp_path)
  absolute = record(str(work), str(work / "sft" / "export"))
  assert absolute["config"]["init"] == "{workdir}/sft/export"
  assert absolute["config"]["data"] == {"sids_file": "sids.npy", "data_dir": str(tmp_path)}
  assert record("W", "W/sft/export") == absolute
  monkeypatch.chdir(work)
  assert record(".", "sft/export") == absolute
  assert record(str(tmp_path / "copy"), str(tmp_path / "copy" / "sft" / "export")) == absolute
  assert workdir_lib.portable({"a": ["x/y", "preset:tiny", 3]}, "sft") == {
    "a": [str(work / "x" / "y"), "preset:tiny", 3]}


def test_result_fields_leave_out_what_does_not_change_the_export():
  saved = record_of(config_of())
  fields = run_identity.result_fields(saved)
  assert "config.train.steps" in fields and "config.optimizer.learning_rate" in fields
  assert not {"config.train.save_every", "config.train.keep", "config.train.micro_batches"} & set(
    fields) and not any(k.startswith("config.eval.") for k in fields)
  neutral = config_of(save_every=4, keep=2, micro_batches=2)
  neutral.eval.batch_size = 2
  assert run_identity.result_fields(record_of(neutral)) == fields


def test_a_field_added_at_its_default_is_the_record_without_it():
  """Records from before an ADDED_AT_DEFAULT field existed resume and keep their digest; the
  field at another value is a change."""
  old = {"config": {"data": {"seed": 0}, "opd": {"group_size": 4}, "rl": {"alpha": 0.2}}}
  new = {"config": {"data": {"seed": 0, "drop_unusable_users": False},
                    "opd": {"group_size": 4, "context": "commit_step"},
                    "rl": {"alpha": 0.2, "temperature": 1.0, "rollout_tau": 0.9}}}
  assert run_identity.changed_fields(old, new) == []
  assert run_identity.result_fields(old) == run_identity.result_fields(new)
  new["config"]["opd"]["context"] = "left_clean"
  new["config"]["rl"]["temperature"] = 0.5
  assert run_identity.changed_fields(old, new) == [
    ("opd.context", "<absent>", "left_clean"), ("rl.temperature", "<absent>", 0.5)]
  assert run_identity.without_added_defaults(
    {"data": {"drop_unusable_users": False, "seed": 1}}, "") == {"data": {"seed": 1}}
