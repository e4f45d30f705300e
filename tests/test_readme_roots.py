"""The README tests' scratch roots (tests/test_readme_commands.py `_root`) take in only the
checkout's own entries: a user's `workdir/` from the README's first command, a `W/` or a
`models/` beside the checkout never break the second command."""

import os
import subprocess

from tests.test_readme_commands import REPO, _checkout_entries, _root


def _checkout_with_user_files(path) -> str:
  """A git checkout with two tracked entries, a venv and a user's own files beside them."""
  repo = str(path)
  subprocess.run(["git", "init", "-q", repo], check=True)
  for name in ("README.md", os.path.join("gr2jax", "x.py")):
    os.makedirs(os.path.dirname(os.path.join(repo, name)) or repo, exist_ok=True)
    open(os.path.join(repo, name), "w").close()
  subprocess.run(["git", "add", "README.md", "gr2jax"], cwd=repo, check=True)
  for name in (".venv", "workdir", "W", "models"):
    os.makedirs(os.path.join(repo, name))
  open(os.path.join(repo, "requests.jsonl"), "w").close()
  return repo


def test_root_takes_in_only_the_checkouts_own_entries(tmp_path):
  repo = _checkout_with_user_files(tmp_path / "checkout")
  assert _checkout_entries(repo) == [".venv", "README.md", "gr2jax"]
  smoke = str(tmp_path / "smoke")
  root = _root(tmp_path / "root", {"W": smoke, "W_smoke": smoke, "workdir": smoke}, repo)
  assert sorted(os.listdir(root)) == [".venv", "README.md", "W", "W_smoke", "gr2jax", "models",
                                      "workdir"]
  assert os.readlink(os.path.join(root, "workdir")) == smoke
  assert not os.path.islink(os.path.join(root, "models"))  # the test's own, not the user's
  assert os.listdir(os.path.join(repo, "models")) == []


def _two_commands(text: str) -> list[str]:
  """The command lines (comments and blank lines dropped) of the README's "## Two commands"
  bash block."""
  block = text.split("## Two commands", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
  return [line for line in block.splitlines() if line.strip() and not line.startswith("#")]


def test_ci_runs_the_readmes_two_commands_in_order():
  readme = _two_commands(open(os.path.join(REPO, "README.md")).read())
  ci = [line for line in open(os.path.join(REPO, ".ci", "run")).read().splitlines()
        if line.startswith("bash ")]
  assert len(readme) == 2 and readme[1] == "bash scripts/test.sh"
  assert ci == readme
