"""The library's floors (WORKSPACE.md, Layout), read from the import statements of gr2jax/ with
`ast` (function-local imports included): data/ and diffusion/ stand side by side on model/,
inference stands below training, run identity (run_identity.py) between the recipe and training,
and the applications, the reranker and the recipe import no training module, directly or through
another module; a fresh process importing an application (but table2.py) loads no training
module, optax or orbax. Above the library: gr2jax/ imports nothing from experiments/, the tools of
experiments/ import no study (experiments/studies/), the studies import the tools and the library
but never one another (a helper two studies share is a tool, experiments/*.py), and no file of
experiments/ edits sys.path (the tools are a package of the editable install)."""

import ast
import glob
import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = "gr2jax.train"
ABOVE_TRAIN = ("gr2jax.chain", "gr2jax.apps")  # what runs training stages / serves
IDENTITY = "gr2jax.run_identity"  # between the recipe and training
ABOVE_DECODING = (TRAIN, *ABOVE_TRAIN, IDENTITY, "gr2jax.recipe", "gr2jax.recipes")
TABLE2 = "gr2jax.apps.table2"  # the one application that runs training (through chain.py)


def _module(path: str) -> str:
  name = os.path.relpath(path, REPO)[:-len(".py")].replace(os.sep, ".")
  return name[:-len(".__init__")] if name.endswith(".__init__") else name


def _graph() -> dict[str, set[str]]:
  """{module: the gr2jax modules it imports} for every module of gr2jax/ (`from P import x` is
  the module P.x where that is one, else P)."""
  paths = glob.glob(os.path.join(REPO, "gr2jax", "**", "*.py"), recursive=True)
  modules = {_module(p): p for p in paths}
  graph = {}
  for name, path in modules.items():
    package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    targets = set()
    for node in ast.walk(ast.parse(open(path).read(), path)):
      if isinstance(node, ast.Import):
        targets |= {a.name for a in node.names}
      elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:  # relative: from the package, up level - 1
          base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1]
                          + ([base] if base else []))
        targets |= {f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                    for a in node.names}
    graph[name] = {t for t in targets if t.split(".")[0] == "gr2jax" and t != "gr2jax"}
  return graph


def _under(module: str, prefixes) -> bool:
  return any(module == p or module.startswith(p + ".") for p in prefixes)


def _reached(graph: dict[str, set[str]], start: str) -> set[str]:
  seen, todo = set(), [start]
  while todo:
    for target in graph.get(todo.pop(), ()):
      if target not in seen:
        seen.add(target)
        todo.append(target)
  return seen


def _named(graph, prefixes) -> list[str]:
  out = sorted(m for m in graph if _under(m, prefixes))
  assert out, f"no module under {prefixes}"
  return out


def test_inference_recipe_and_applications_import_no_training_module():
  """gr2jax/apps/, gr2jax/decoding/, gr2jax/reranker*, gr2jax/recipe*.py."""
  graph = _graph()
  names = sorted(m for m in graph if _under(m, ("gr2jax.apps", "gr2jax.decoding"))
                 or m.startswith(("gr2jax.reranker", "gr2jax.recipe")))
  assert {"gr2jax.recipe", "gr2jax.recipes", "gr2jax.decoding.reranker"} <= set(names)
  for module in names:
    bad = sorted(t for t in graph[module] if _under(t, (TRAIN,)))
    assert not bad, f"{module} imports {bad}"


def test_decoding_imports_nothing_above_it():
  graph = _graph()
  for module in _named(graph, ("gr2jax.decoding",)):
    bad = sorted(t for t in graph[module] if _under(t, ABOVE_DECODING))
    assert not bad, f"{module} imports {bad} (a floor above gr2jax/decoding/)"


def test_training_imports_neither_the_step_runner_nor_an_application_nor_the_recipes():
  """train/ reads the recipe's typed views (gr2jax/recipe.py, a floor below), never the named
  recipes' values (gr2jax/recipes.py), the step runner or an application."""
  graph = _graph()
  for module in _named(graph, (TRAIN,)):
    bad = sorted(t for t in graph[module] if _under(t, (*ABOVE_TRAIN, "gr2jax.recipes")))
    assert not bad, f"{module} imports {bad}"


def test_the_server_the_offline_tool_and_the_recipe_never_reach_training():
  """Not even through another module: a serving replica loads no training code."""
  graph = _graph()
  for start in ("gr2jax.apps.serve.server", "gr2jax.apps.rerank", "gr2jax.decoding.reranker",
                "gr2jax.recipes"):
    bad = sorted(m for m in _reached(graph, start) if _under(m, (TRAIN, *ABOVE_TRAIN))
                 and not m.startswith("gr2jax.apps.serve") and m != "gr2jax.apps")
    assert not bad, f"{start} reaches {bad}"


def test_no_application_but_table2_reaches_training_or_the_step_runner():
  """Not even through another module: the table writers and the results stamp (apps/report.py,
  which reads run identity, not chain.py) load no training code, as the server does not."""
  graph = _graph()
  starts = [m for m in _named(graph, ("gr2jax.apps",)) if m != TABLE2]
  assert {"gr2jax.apps.tables", "gr2jax.apps.report"} <= set(starts)
  for start in starts:
    bad = sorted(m for m in _reached(graph, start) if _under(m, (TRAIN, "gr2jax.chain")))
    assert not bad, f"{start} reaches {bad}"


def _applications() -> list[str]:
  """Every module of gr2jax/apps/ but table2.py, by name."""
  return sorted(m for m in map(_module, glob.glob(os.path.join(REPO, "gr2jax", "apps", "**",
                                                               "*.py"), recursive=True))
                if m != TABLE2)


def test_importing_an_application_loads_no_training_module_optax_or_orbax():
  """Each module in a fresh process of its own (the processes run side by side): what the
  imports really load (optax and orbax are imported where a model is trained, or params are
  written or restored, not with the modules that do it)."""
  procs = {module: subprocess.Popen(
    [sys.executable, "-c", f"import json, sys, {module}; print(json.dumps(sorted(m for m in "
     f"sys.modules if m == '{TRAIN}' or m.startswith(('{TRAIN}.', 'optax', 'orbax')))))"],
    cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for module in _applications()}
  assert len(procs) >= 10
  for module, proc in procs.items():
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr[-2000:]
    loaded = json.loads(stdout.splitlines()[-1])
    assert not loaded, f"import {module} loads {loaded[:10]} ({len(loaded)} in all)"


def test_diffusion_exports_and_data_stand_side_by_side_on_the_model():
  """None of diffusion/, exports.py and data/ (the batch type included) reaches another of them,
  HF directories or inference, not even through another module."""
  graph = _graph()
  floors = ("gr2jax.diffusion", "gr2jax.exports", "gr2jax.data")
  above = ("gr2jax.hf", "gr2jax.load", "gr2jax.decoding", *ABOVE_DECODING)
  for floor in floors:
    others = tuple(f for f in floors if f != floor)
    for module in _named(graph, (floor,)):
      bad = sorted(m for m in _reached(graph, module) if _under(m, (*others, *above)))
      assert not bad, f"{module} reaches {bad}"


def test_run_identity_stands_between_the_recipe_and_training():
  """run_identity.py reads the recipe's views and reaches no training module, step runner,
  application or named recipe; only those above it (train/, chain.py, apps/) import it."""
  graph = _graph()
  reached = _reached(graph, IDENTITY)
  assert "gr2jax.recipe" in reached
  bad = sorted(m for m in reached if _under(m, (TRAIN, *ABOVE_TRAIN, "gr2jax.recipes")))
  assert not bad, f"{IDENTITY} reaches {bad}"
  importers = sorted(m for m, targets in graph.items() if IDENTITY in targets)
  assert {"gr2jax.train.run_checkpoints", "gr2jax.chain", "gr2jax.apps.report"} <= set(importers)
  bad = [m for m in importers if not _under(m, (TRAIN, *ABOVE_TRAIN))]
  assert not bad, f"{bad} import {IDENTITY} (a floor above them)"


def test_no_import_circle():
  graph = _graph()
  for module in graph:
    assert module not in _reached(graph, module), f"{module} imports itself through others"


def _imports(path: str) -> set[str]:
  """The absolute module names `path` imports (`from P import x`: P and P.x)."""
  names = set()
  for node in ast.walk(ast.parse(open(path).read(), path)):
    if isinstance(node, ast.Import):
      names |= {a.name for a in node.names}
    elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
      names |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
  return names


def _files(*parts: str) -> list[str]:
  out = sorted(glob.glob(os.path.join(REPO, *parts), recursive=True))
  assert out, f"no file matches {parts}"
  return out


def test_the_library_imports_nothing_from_experiments():
  for path in _files("gr2jax", "**", "*.py"):
    bad = sorted(n for n in _imports(path) if _under(n, ("experiments",)))
    assert not bad, f"{os.path.relpath(path, REPO)} imports {bad}"


def test_the_tools_import_no_study():
  """experiments/*.py and its configs stand below experiments/studies/."""
  paths = _files("experiments", "*.py") + _files("experiments", "configs", "*.py")
  for path in paths:
    bad = sorted(n for n in _imports(path) if _under(n, ("experiments.studies",)))
    assert not bad, f"{os.path.relpath(path, REPO)} imports the studies {bad}"


def test_the_studies_import_no_other_study():
  """experiments/studies/*.py stand side by side, as the applications do: each imports the tools
  (experiments/*.py) and the library, never another study."""
  paths = [p for p in _files("experiments", "studies", "*.py") if not p.endswith("__init__.py")]
  assert len(paths) > 5
  for path in paths:
    bad = sorted(n for n in _imports(path) if _under(n, ("experiments.studies",)))
    assert not bad, f"{os.path.relpath(path, REPO)} imports the studies {bad}"


def test_no_file_of_experiments_edits_sys_path():
  """The tools and the studies import one another as the package `experiments` (installed
  editable), never by putting a directory on sys.path."""
  for path in _files("experiments", "**", "*.py"):
    for node in ast.walk(ast.parse(open(path).read(), path)):
      if (isinstance(node, ast.Attribute) and node.attr == "path"
          and isinstance(node.value, ast.Name) and node.value.id == "sys"):
        raise AssertionError(f"{os.path.relpath(path, REPO)}:{node.lineno} uses sys.path")


MAX_PARAMETERS = 8
NARROW = ("decoding", "diffusion", "apps", "model")  # the packages held to MAX_PARAMETERS


def _parameter_count(fn: ast.FunctionDef, method: bool) -> int:
  """Positional + keyword parameters, *args and **kwargs one each, self / cls not counted."""
  a = fn.args
  n = len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs) + bool(a.vararg) + bool(a.kwarg)
  return n - (1 if method and (a.posonlyargs or a.args) else 0)


def test_public_functions_take_at_most_eight_parameters():
  """gr2jax/{decoding,diffusion,apps,model}/: a public function (module level, or a method of a
  public class) takes at most MAX_PARAMETERS; more means related arguments belong in one typed
  object (a spec, a NamedTuple)."""
  bad = []
  for package in NARROW:
    for path in _files("gr2jax", package, "**", "*.py"):
      tree = ast.parse(open(path).read(), path)
      found = [(n, False) for n in tree.body if isinstance(n, ast.FunctionDef)]
      for cls in tree.body:
        if isinstance(cls, ast.ClassDef) and not cls.name.startswith("_"):
          found += [(n, not any(isinstance(d, ast.Name) and d.id == "staticmethod"
                                for d in n.decorator_list))
                    for n in cls.body if isinstance(n, ast.FunctionDef)]
      bad += [f"{os.path.relpath(path, REPO)}:{fn.lineno} {fn.name} ({count})"
              for fn, method in found if not fn.name.startswith("_")
              and (count := _parameter_count(fn, method)) > MAX_PARAMETERS]
  assert not bad, f"public functions with more than {MAX_PARAMETERS} parameters: {bad}"
