"""WORKSPACE.md's claims that the code can check: the modules it lists as tested through their
callers' tests are exactly the library modules without a test module of their own
(tests/<path>/test_<module>.py)."""

import pathlib
import re

REPO = pathlib.Path(__file__).resolve().parent.parent


def modules_without_their_own_test() -> set[str]:
  """Basenames of gr2jax/ modules (not __init__) with no tests/<path>/test_<module>.py."""
  out = set()
  for path in (REPO / "gr2jax").rglob("*.py"):
    if path.name == "__init__.py":
      continue
    relative = path.parent.relative_to(REPO / "gr2jax")
    if not (REPO / "tests" / relative / f"test_{path.name}").is_file():
      out.add(path.name)
  return out


def listed_in_workspace() -> set[str]:
  """Basenames WORKSPACE.md names between "Modules without a test" and "Shared helpers"."""
  text = (REPO / "WORKSPACE.md").read_text()
  paragraph = text.split("Modules without a test", 1)[1].split("Shared helpers", 1)[0]
  named = set(re.findall(r"([A-Za-z_]\w*\.py)\b", paragraph))
  return {name for name in named if not name.startswith("test_")}


def test_workspace_lists_exactly_the_modules_without_their_own_test():
  assert listed_in_workspace() == modules_without_their_own_test()
