"""The committed documents and the library's source name no issue tracker and no development
machine: no issue reference ("#19", "issue 19", "issue #19") and no path of the machine a
measurement was taken on ("/work/...", "/tmp/pytest...", "/root/..."). A reader who never saw
the project's tracker or machines must be able to follow every sentence; comments cite the paper
(arXiv id and section) or a committed doc instead.

Plain text scanning, no JAX: one test per root, so each root passes or fails on its own.
"""

import pathlib
import re

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent

# root (relative to the repository) -> the file suffixes scanned under it (a file root: its own).
ROOTS = {
  "README.md": (".md",),
  "WORKSPACE.md": (".md",),
  "docs": (".md", ".json", ".jsonl", ".txt"),
  "gr2jax": (".py",),
}

# An issue reference: "issue 19", "Issue #19", "issues #18", "issue-19"; or a bare "#19",
# "(#19)", "#19's": a '#' that starts a token, then digits, then no further word character, so
# hex colours such as "#1f77b4", HLO names such as "%dot.721", markdown headings "# x" and
# comments "# [B, T]" do not match. A 6- or 8-digit all-numeric token is a colour ("#000000").
_ISSUE = re.compile(r"\bissues?[\s\-]*#?\d+\b|(?<![\w#&/])#(?!(?:\d{6}|\d{8})\b)\d+\b",
                    re.IGNORECASE)
# Paths of a development machine.
_MACHINE_PATH = re.compile(r"/work/|/tmp/pytest|/root/")

PATTERNS = {"issue reference": _ISSUE, "development-machine path": _MACHINE_PATH}


def findings(text: str) -> list[tuple[int, str, str]]:
  """Every issue reference and development-machine path in `text`.

  Args:
    text: a file's contents.

  Returns:
    (1-based line, kind, the matched text) per finding, in line order.
  """
  found = []
  for number, line in enumerate(text.splitlines(), start=1):
    for kind, pattern in PATTERNS.items():
      found.extend((number, kind, m.group(0)) for m in pattern.finditer(line))
  return found


def files_under(root: str) -> list[pathlib.Path]:
  """The scanned files of one root of ROOTS.

  Args:
    root: a key of ROOTS.

  Returns:
    the files (a file root: itself), sorted; every path exists.
  """
  path = REPO / root
  if path.is_file():
    return [path]
  return sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in ROOTS[root])


@pytest.mark.parametrize(
  "text, expected",
  [
    ("see issue #19's table", ["issue #19"]),
    ("(issue 7) and Issue 18", ["issue 7", "Issue 18"]),
    ("fixed in #8, then #15.", ["#8", "#15"]),
    ("written to /work/runs/t2_p2 and /tmp/pytest-of-x/y, /root/.cache", ["/work/", "/tmp/pytest",
                                                                           "/root/"]),
    ("# [B, T] shape comment\n## 3. heading", []),
    ("colour #1f77b4, #000000 and %dot.721 = bf16[9824,4096]", []),
    ("x[#] and C# 12 and a&#39;b and url/#3", []),
    ("tissue 19 cells, 2 issues remain", []),
  ],
)
def test_patterns(text, expected):
  assert [match for _, _, match in findings(text)] == expected


@pytest.mark.parametrize("root", sorted(ROOTS))
def test_no_issue_references_or_machine_paths(root):
  """Every file of `root` is free of issue references and development-machine paths."""
  files = files_under(root)
  assert files, f"{root}: nothing to scan"
  bad = [f"{path.relative_to(REPO)}:{line}: {kind} {match!r}"
         for path in files
         for line, kind, match in findings(path.read_text(encoding="utf-8"))]
  assert not bad, f"{len(bad)} finding(s) under {root}:\n" + "\n".join(bad)
