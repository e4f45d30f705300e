"""Running a study's main as its command line does (cli.run: flags parsed by cli.parse_flags,
main under cli.one_line_refusals), with nothing loaded: what the studies' refusal tests share."""

import pytest
from absl import flags

from gr2jax import cli, load


def refusal(module, argv: list[str], monkeypatch, capsys) -> str:
  """The one line `module.main` refuses `argv` with (exit status 1), loading no model."""
  flag_values = flags.FlagValues()
  module.define_flags(flag_values)
  cli.parse_flags(argv, flag_values)
  monkeypatch.setattr(module, "FLAGS", flag_values)

  def no_load(path, *args, **kwargs):
    raise AssertionError(f"{path} was loaded")

  monkeypatch.setattr(load, "load_model", no_load)
  with pytest.raises(SystemExit) as e:
    cli.one_line_refusals()(module.main)([])
  err = capsys.readouterr().err
  assert e.value.code == 1 and len(err.splitlines()) == 1, err
  return err
