"""The recipe's typed views (gr2jax/recipe.py: StageView, EvaluationView, TablesView).

1. Every attribute read of a view in gr2jax/ and experiments/ names a field it has, read with
   `ast`, so a stale read (`view.eval.tau` after the redesign moved tau to `decode.eval_tau`)
   fails here rather than in a user's run. A view is reached through
   - a parameter or variable annotated with a view type (`table: TablesView`),
   - a call that returns one (`recipe.stage_config(...)`, or a function of the same module
     annotated to return a view),
   - `<ctx>.config`, where `ctx` is a training loop Context (annotated `Context`, or by the
     code's convention named `ctx`),
   - a name bound to any of these or to a block of one (`cfg = ctx.config`, `tcfg = config.train`),
   and each step of a read (`view.eval.split`) is checked against the fields of the value there:
   a view's or a settings block's fields (gr2jax/settings.py), the DecodeSpec's fields, taken
   from the tiny recipe's views (blocks merged over the stages). Reads through
   `getattr(config, "name")` are not checked.
2. A view's `to_dict()` is the run record's `config` and feeds the chain's digests: the records
   and digests of every view of the tiny and qwen3_8b recipes equal tests/view_records.json,
   written by `_records` below at commit 2ca5333, before the views were typed (its ConfigDict
   views; its step runner was then gr2jax/apps/chain.py), so existing workdirs resume and are
   reused. Changing one of those recipes on purpose changes them: rewrite the file with
   `python -m tests.test_views` and say why in the commit.
"""

import ast
import dataclasses
import glob
import inspect
import json
import os
import sys
import tempfile
import typing

import ml_collections
import pytest

from gr2jax import recipe, recipes, run_identity, stage_registry
from gr2jax.train import loop

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECORDS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "view_records.json")
VIEW_TYPES = (recipe.StageView, recipe.EvaluationView, recipe.TablesView)
CONTEXT_NAME = "ctx"  # the code's name for a loop.Context, whose `config` is a view


@dataclasses.dataclass
class Fields:
  """What may be read off a value: `names`, each with the Fields of its value (None: a value
  whose attributes are not checked: a path, a number, a tokenizer)."""
  kind: str
  names: dict


def fields_of(value) -> Fields | None:
  """The Fields of a view, a settings dataclass or a block (ConfigDict), with the public
  attributes of its type (methods such as to_dict); None for any other value."""
  if isinstance(value, ml_collections.ConfigDict):
    items = {k: value[k] for k in value.keys()}
  elif dataclasses.is_dataclass(value) and not isinstance(value, type):
    items = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
  else:
    return None
  names = {n: None for n in dir(type(value)) if not n.startswith("_")}
  names.update({k: fields_of(v) for k, v in items.items()})
  return Fields(type(value).__name__, names)


def merge(a: Fields | None, b: Fields | None) -> Fields | None:
  """The Fields of a value that is one of a or b (a block present in some stages only)."""
  if a is None or b is None:
    return a or b
  names = dict(a.names)
  for name, sub in b.names.items():
    names[name] = merge(names.get(name), sub)
  return Fields(a.kind if a.kind == b.kind else f"{a.kind} | {b.kind}", names)


def view_fields() -> dict[str, Fields]:
  """{view type name: its Fields}, from every view of the tiny recipe."""
  r = recipes.get("tiny")
  views = ([recipe.stage_config(r, s, "W") for s in stage_registry.names()]
           + [recipe.evaluation_config(r)]
           + [recipe.tables_config(r, name, "W") for name in ("table3", "table4", "fig6")])
  out = {}
  for view in views:
    name = type(view).__name__
    out[name] = merge(out.get(name), fields_of(view))
  assert set(out) == {t.__name__ for t in VIEW_TYPES}
  return out


def view_functions() -> dict[str, str]:
  """{function of gr2jax/recipe.py: the view type it returns} (stage_config: 'StageView'...)."""
  out = {}
  for name, fn in inspect.getmembers(recipe, inspect.isfunction):
    returned = typing.get_type_hints(fn).get("return")
    if fn.__module__ == recipe.__name__ and returned in VIEW_TYPES:
      out[name] = returned.__name__
  assert {"stage_config", "evaluation_config", "tables_config"} <= set(out)
  return out


class _Checker:
  """Walks one module: binds names to Fields (module docstring, 1) statement by statement and
  checks every attribute chain rooted at a bound name."""

  def __init__(self, tree: ast.Module, path: str, views: dict[str, Fields]):
    self.path, self.views, self.stale, self.checked = path, views, [], 0
    context = Fields("Context", {f.name: None for f in dataclasses.fields(loop.Context)})
    context.names["config"] = merge(views["StageView"], views["EvaluationView"])
    self.context = context
    self.recipe_aliases, self.producers = set(), {}
    self.functions = functions = view_functions()
    for node in ast.walk(tree):
      if isinstance(node, ast.ImportFrom) and node.module == "gr2jax":
        self.recipe_aliases |= {a.asname or a.name for a in node.names if a.name == "recipe"}
      elif isinstance(node, ast.ImportFrom) and node.module == "gr2jax.recipe":
        self.producers.update({a.asname or a.name: views[functions[a.name]]
                               for a in node.names if a.name in functions})
      elif isinstance(node, ast.Import):
        self.recipe_aliases |= {a.asname for a in node.names
                                if a.name == "gr2jax.recipe" and a.asname}
    for node in tree.body:  # this module's own functions annotated to return a view
      if isinstance(node, ast.FunctionDef) and node.returns is not None:
        view = self._annotated(node.returns)
        if view is not None:
          self.producers[node.name] = view
    self._body(tree.body, {})

  def _annotated(self, annotation) -> Fields | None:
    """The Fields of an annotation naming view types (unions merged) or Context."""
    names = set()
    for node in ast.walk(annotation):
      if isinstance(node, ast.Name):
        names.add(node.id)
      elif isinstance(node, ast.Attribute):
        names.add(node.attr)
      elif isinstance(node, ast.Constant) and isinstance(node.value, str):  # "StageView"
        names |= {n.id if isinstance(n, ast.Name) else n.attr
                  for n in ast.walk(ast.parse(node.value, mode="eval"))
                  if isinstance(n, (ast.Name, ast.Attribute))}
    if "Context" in names:
      return self.context
    out = None
    for name in sorted(names & set(self.views)):
      out = merge(out, self.views[name])
    return out

  def _value(self, node, env) -> Fields | None:
    """The Fields of an expression's value, when it is a view or reached from one."""
    if isinstance(node, ast.Call):
      f = node.func
      if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and (
          f.value.id in self.recipe_aliases) and f.attr in self.functions:
        return self.views[self.functions[f.attr]]
      return self.producers.get(f.id) if isinstance(f, ast.Name) else None
    chain_ = _chain(node)
    return None if chain_ is None else self._resolve(chain_, env, node, report=False)

  def _resolve(self, chain_: list[str], env, node, report: bool = True) -> Fields | None:
    """Follows `name.a.b...` from a bound name; with `report`, records a step that names no
    field and counts the checked ones (once per read: _check reports, _value does not)."""
    base, *attrs = chain_
    fields = env.get(base)
    if fields is None:
      return None
    for i, attr in enumerate(attrs):
      if attr not in fields.names:
        if report:
          self.stale.append(f"{self.path}:{node.lineno}: {'.'.join(chain_[:i + 2])}: "
                            f"{fields.kind} has no field {attr!r}")
        return None
      self.checked += report
      fields = fields.names[attr]
      if fields is None:
        return None
    return fields

  def _check(self, node, env) -> None:
    """Every outermost attribute chain in an expression."""
    inner = {id(n.value) for n in ast.walk(node) if isinstance(n, ast.Attribute)}
    for n in ast.walk(node):
      if isinstance(n, ast.Attribute) and id(n) not in inner:
        chain_ = _chain(n)
        if chain_ is not None:
          self._resolve(chain_, env, n)

  def _function(self, node, env) -> None:
    env = dict(env)
    args = node.args
    for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs]:
      fields = self._annotated(arg.annotation) if arg.annotation is not None else None
      self._bind(arg.arg, fields, env)
    self._body(node.body, env)

  def _bind(self, name: str, fields, env) -> None:
    if fields is None and name == CONTEXT_NAME:  # a loop.Context, by the code's convention
      fields = self.context
    if fields is None:
      env.pop(name, None)
    else:
      env[name] = fields

  def _body(self, statements, env) -> None:
    for stmt in statements:
      if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
        self._function(stmt, env)
        continue
      if isinstance(stmt, ast.ClassDef):
        self._body(stmt.body, dict(env))
        continue
      bodies = []
      for _, value in ast.iter_fields(stmt):
        items = value if isinstance(value, list) else [value]
        for item in items:
          if isinstance(item, ast.stmt):
            bodies.append(item)
          elif isinstance(item, ast.excepthandler):
            bodies.extend(item.body)
          elif isinstance(item, ast.AST):
            self._check(item, env)
      self._assign(stmt, env)
      self._body(bodies, env)

  def _assign(self, stmt, env) -> None:
    if isinstance(stmt, ast.Assign):
      fields = self._value(stmt.value, env)
      for target in stmt.targets:
        if isinstance(target, ast.Name):
          self._bind(target.id, fields, env)
        else:
          for name in _bound_names(target):
            self._bind(name, None, env)
    elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
      fields = self._annotated(stmt.annotation)
      if fields is None and stmt.value is not None:
        fields = self._value(stmt.value, env)
      self._bind(stmt.target.id, fields, env)
    elif isinstance(stmt, (ast.For, ast.With)):
      targets = [stmt.target] if isinstance(stmt, ast.For) else [
        i.optional_vars for i in stmt.items if i.optional_vars is not None]
      for target in targets:
        for name in _bound_names(target):
          self._bind(name, None, env)


def _bound_names(target) -> list[str]:
  """The names an assignment target rebinds (`a, (b, *c)`; not `a.x` or `a[i]`)."""
  if isinstance(target, ast.Name):
    return [target.id]
  if isinstance(target, (ast.Tuple, ast.List)):
    return [n for elt in target.elts for n in _bound_names(elt)]
  return _bound_names(target.value) if isinstance(target, ast.Starred) else []


def _chain(node) -> list[str] | None:
  """['a', 'b', 'c'] of `a.b.c`; None when the chain does not start at a name."""
  attrs = []
  while isinstance(node, ast.Attribute):
    attrs.append(node.attr)
    node = node.value
  return [node.id, *reversed(attrs)] if isinstance(node, ast.Name) else None


def check_source(source: str, path: str, views: dict[str, Fields]) -> _Checker:
  return _Checker(ast.parse(source, path), path, views)


@pytest.fixture(scope="module")
def views():
  return view_fields()


def _modules() -> list[str]:
  paths = (glob.glob(os.path.join(REPO, "gr2jax", "**", "*.py"), recursive=True)
           + glob.glob(os.path.join(REPO, "experiments", "**", "*.py"), recursive=True))
  return sorted(paths)


def test_every_view_read_in_the_code_names_a_field(views):
  stale, checked = [], {}
  for path in _modules():
    result = check_source(open(path).read(), os.path.relpath(path, REPO), views)
    stale += result.stale
    checked[result.path] = result.checked
  assert not stale, "reads of fields the views do not have:\n" + "\n".join(stale)
  for path in ("gr2jax/train/loop.py", "gr2jax/train/stages.py", "gr2jax/chain.py",
               "gr2jax/apps/tables.py", "experiments/run.py", "experiments/studies/bench_train.py"):
    assert checked[path] > 0, f"no view read found in {path}: the checker lost track of it"


STALE = '''
from gr2jax import recipe as recipe_lib
from gr2jax.recipe import StageView


def name(view: StageView):
  return f"{view.eval.split}_tau{view.eval.tau:g}"


def shrink(ctx):
  c = ctx.config.settings
  return c.eps_low, c.eps_lo


def evaluate(r):
  view = recipe_lib.evaluation_config(r)
  return view.optimizer.learning_rate


def table(t: "recipe_lib.TablesView | None"):
  cfg = t.fig6
  return cfg.tau, cfg.taus
'''


def test_the_checker_finds_stale_reads(views):
  """A stale read through each way of reaching a view, and the good reads beside them."""
  result = check_source(STALE, "stale.py", views)
  assert [line.split(": ", 1)[1] for line in result.stale] == [
    "view.eval.tau: EvalSettings has no field 'tau'",
    "c.eps_lo: ARRLSettings | CFTSettings | OPDSettings | RLSettings has no field 'eps_lo'",
    "view.optimizer: EvaluationView has no field 'optimizer'",
    "cfg.taus: Fig6Settings has no field 'taus'"]
  assert result.checked >= 6  # view.eval, .split, ctx.config, .settings, c.eps_low, t.fig6, cfg.tau


def test_a_missing_field_is_an_attribute_error_and_views_are_frozen():
  r = recipes.get("tiny")
  view = recipe.evaluation_config(r)
  with pytest.raises(AttributeError, match="tau"):
    view.eval.tau  # noqa: B018
  with pytest.raises(dataclasses.FrozenInstanceError):
    view.stage = "sft"
  with pytest.raises(AttributeError, match="optimizer"):
    view.optimizer  # noqa: B018
  assert recipe.stage_config(r, "sft", "W").settings is None  # a stage without its own block


def _recipe(variant: str) -> recipe.Recipe:
  """The recipe `variant` with paths that do not depend on the checkout: the data directory
  and (qwen3_*) the HF directory `hf` of the current directory, by names without a separator
  (workdir.portable keeps them as they are)."""
  c = recipes.config(variant)
  c.data.data_dir = "amazon_beauty"
  c.hf_dir = "hf" if variant else ""
  return recipe.from_config(c)


def _records() -> dict:
  """{variant: {view: its run record's `config`, 'digests': the chain's step digests}} for the
  tiny and qwen3_8b recipes in workdir W (an HF directory `hf` in the current directory)."""
  def record(view):
    return run_identity.run_record(view, workdir="W", data_build={}, init_sha256="",
                                   lengths=(0, 0))["config"]

  out = {}
  for variant in ("", "qwen3_8b"):
    r = _recipe(variant)
    views = {**{s: recipe.stage_config(r, s, "W") for s in stage_registry.names()},
             "eval": recipe.evaluation_config(r),
             **{t: recipe.tables_config(r, t, "W") for t in ("table3", "table4", "fig6")}}
    out[variant or "tiny"] = {**{name: record(v) for name, v in views.items()},
                              "digests": run_identity.step_digests(r, "W")}
  return out


def _in_hf_dir(directory: str) -> None:
  os.chdir(directory)
  os.makedirs("hf", exist_ok=True)
  with open(os.path.join("hf", "config.json"), "w") as f:
    f.write("{}")


def test_records_and_digests_are_those_of_the_configdict_views(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  _in_hf_dir(str(tmp_path))
  expected = json.load(open(RECORDS))
  got = _records()
  assert got.keys() == expected.keys()
  for variant, views in expected.items():
    assert got[variant].keys() == views.keys(), variant
    for name, value in views.items():
      # the same JSON, keys in the same order (json.dumps keeps the order)
      assert json.dumps(got[variant][name]) == json.dumps(value), (variant, name)


if __name__ == "__main__":  # rewrites tests/view_records.json (module docstring, 2)
  out = sys.argv[1] if len(sys.argv) > 1 else RECORDS
  with tempfile.TemporaryDirectory() as tmp:
    cwd = os.getcwd()
    _in_hf_dir(tmp)
    records = _records()
    os.chdir(cwd)
  with open(out, "w") as f:
    json.dump(records, f, indent=1)
    f.write("\n")
