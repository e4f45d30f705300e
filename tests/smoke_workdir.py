"""One finished tiny workdir per test session, made by the README's smoke command
(`experiments/run.py --config=table2.py:smoke --workdir=W_smoke`: every stage and Table 2 row on
a few examples, ~3 min on 2 cores, alone): the integration tests that need real exports share it.

  from tests.smoke_workdir import smoke_workdir
  workdir = smoke_workdir(tmp_path_factory)   # built by the first caller of the session
"""

import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUN = os.path.join(REPO, "experiments", "run.py")
SMOKE = ["--config=table2.py:smoke"]  # the README's command, less its --workdir


def env() -> dict[str, str]:
  """A command line's environment: one CPU device, as a user's (not the tests' 8), no bars."""
  out = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  out["GR2JAX_PROGRESS"] = "0"
  return out


def smoke_workdir(tmp_path_factory) -> str:
  """The session's finished smoke workdir (built on the first call)."""
  root = tmp_path_factory.getbasetemp() / "smoke_workdir"
  workdir, done = root / "W_smoke", root / "done"
  if not done.exists():
    result = subprocess.run([sys.executable, RUN, *SMOKE, f"--workdir={workdir}"], cwd=REPO,
                            env=env(), capture_output=True, text=True, timeout=3600)
    assert result.returncode == 0, result.stderr[-4000:]
    done.touch()
  return str(workdir)
