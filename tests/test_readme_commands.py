"""Every shell command of README.md runs as written, on tiny settings.

The commands are parsed from README.md itself (its ```bash blocks, continuation lines joined,
comments dropped, and its ```python notebook block): a command the README gains that is not in
COMMANDS below fails `test_every_readme_command_is_covered`. Each runs from a directory laid
out as the repository root (its tracked top-level entries and the venv linked, never a user's
own files beside them: tests/test_readme_roots.py) where the README's workdirs exist, so nothing
is written into the repository; `python` is the venv's. The only flags added shrink the
work: `:smoke` (every stage on a few examples), the HF-layout recipe's data and evaluation sizes
(tests/test_chain.py HF_SMOKE), fewer CFT steps, one compiled server batch; `/models/...`
are directories of the test (Qwen3-8B: a random-weight Qwen3 in the real HF layout,
tests/hf_layout.py), and `[--...]` options are left out.

Covered (README command -> how it runs):
  bash scripts/setup.sh && .venv/bin/python experiments/run.py --config=data.py
      --workdir=workdir                      data.py:smoke; `workdir` is the smoke workdir
  bash scripts/test.sh                       not run: the CI command, which runs this test
  python experiments/run.py --config=sft.py --workdir=W                       :smoke
  python experiments/run.py --config=cft.py --workdir=W                       :smoke
  python experiments/run.py --config=cft.py --workdir=W --config.stages.cft.train.steps=100
      --config.decode.eval_tau=0.9 --config.stages.cft.train.restart=True
                                             :smoke, steps=3 (the smoke's CFT run moved aside)
  python experiments/run.py --config=eval.py --workdir=W --config.evaluate.ckpt=W/cft/export
                                             :smoke; writes W/cft/export/eval_*_tau1.json
  python experiments/run.py --config=cft.py:qwen3_8b --help
                                             not run here: tests/experiments/test_run.py's help
                                             test runs it
  python weights_conversion/convert_hf.py --hf_dir=/models/Qwen3-8B
      --out_dir=/models/q8b_gr2jax [...]     as written
  python weights_conversion/export_hf.py --ckpt=W/ar_rl/export --out_dir=/models/gr2_ar
  python weights_conversion/ar_to_diffusion.py --ar=W/ar_rl/export --out=W/naive
      --block_size=32                        as written; W/naive's metadata says diffusion
  python experiments/run.py --config=table2.py:qwen3_8b,smoke
      --config.hf_dir=/models/Qwen3-8B --workdir=W_smoke       + HF_SMOKE (own directory)
  python experiments/run.py --config=table2.py:qwen3_8b --config.hf_dir=/models/Qwen3-8B
      --workdir=W                            ,smoke + HF_SMOKE: W is that run's W_smoke
  python experiments/run.py --config=table2.py:smoke --workdir=W_smoke
                                             as written (the session's smoke workdir)
  python experiments/run.py --config=table2.py --workdir=W
      --config.data.sids_file=results/sids_table2.npy          :smoke (own directory)
  python experiments/run.py --config=serve.py --workdir=W --config.serve.ckpt=W/rl/export
      --config.serve.port=8000               :smoke, serve.batch_buckets=1; then the curl
      command as written; then again with the comment's --config.serve.verify_with=W/ar_rl/export
      (lossless) and one request through httpx
  curl -s http://127.0.0.1:8000/v1/rerank ...                                 as written
  .venv/bin/pip install "jax[cuda12]==0.10.2"  not run: a GPU box's install (needs the network)
  .venv/bin/python -c "import jax; print(jax.devices())"                      as written
  bash scripts/setup.sh                      as written
  the notebook snippet (## From a notebook)  as written, W and requests.jsonl in its directory
"""

import glob
import json
import os
import re
import signal
import subprocess
import sys

import httpx
import pytest

from tests.smoke_workdir import REPO, env, smoke_workdir

pytestmark = pytest.mark.integration  # several tiny chains end to end

README = os.path.join(REPO, "README.md")
PY = os.path.join(REPO, ".venv", "bin")
SMOKE = ":smoke"
SERVE = ["--config.serve.batch_buckets=1"]  # one compiled batch per prompt width
LOSSLESS = "--config.serve.verify_with=W/ar_rl/export"
REQUEST = {"id": "r1", "history": [0, 1, 2], "candidates": list(range(10, 20))}

# README command -> (root, how): root 'tiny' (W, W_smoke and workdir: the session's smoke run),
# 'sids' (W: a workdir of its own for the run with the SIDs file, another data build) or 'hf'
# (W and W_smoke: the HF-layout recipe's run); how: extra args, a rewrite, or why it is not run.
COMMANDS = {
  "bash scripts/setup.sh && .venv/bin/python experiments/run.py --config=data.py "
  "--workdir=workdir": ("tiny", {"config": SMOKE}),
  "bash scripts/test.sh": (None, "the CI command itself: it runs this test"),
  "python experiments/run.py --config=sft.py --workdir=W": ("tiny", {"config": SMOKE}),
  "python experiments/run.py --config=cft.py --workdir=W": ("tiny", {"config": SMOKE}),
  "python experiments/run.py --config=cft.py --workdir=W --config.stages.cft.train.steps=100 "
  "--config.decode.eval_tau=0.9 --config.stages.cft.train.restart=True":
    ("tiny", {"config": SMOKE, "replace": ("steps=100", "steps=3")}),
  "python experiments/run.py --config=eval.py --workdir=W --config.evaluate.ckpt=W/cft/export":
    ("tiny", {"config": SMOKE}),
  "python experiments/run.py --config=cft.py:qwen3_8b --help": (
    None, "tests/experiments/test_run.py::test_help_names_every_training_stage_and_every_setting "
    "runs it"),
  "python weights_conversion/convert_hf.py --hf_dir=/models/Qwen3-8B "
  "--out_dir=/models/q8b_gr2jax [--param_dtype=bfloat16] "
  "[--add_tokens=W/tokenizer-*/added_tokens.txt]": ("tiny", {}),
  "python weights_conversion/export_hf.py --ckpt=W/ar_rl/export --out_dir=/models/gr2_ar":
    ("tiny", {}),
  "python weights_conversion/ar_to_diffusion.py --ar=W/ar_rl/export --out=W/naive "
  "--block_size=32": ("tiny", {}),
  "python experiments/run.py --config=table2.py:qwen3_8b,smoke "
  "--config.hf_dir=/models/Qwen3-8B --workdir=W_smoke": ("hf", {"hf": True}),
  "python experiments/run.py --config=table2.py:qwen3_8b --config.hf_dir=/models/Qwen3-8B "
  "--workdir=W": ("hf", {"config": ",smoke", "hf": True}),
  "python experiments/run.py --config=table2.py:smoke --workdir=W_smoke": ("tiny", {}),
  "python experiments/run.py --config=table2.py --workdir=W "
  "--config.data.sids_file=results/sids_table2.npy": ("sids", {"config": SMOKE}),
  "python experiments/run.py --config=serve.py --workdir=W --config.serve.ckpt=W/rl/export "
  "--config.serve.port=8000": ("tiny", "serve"),
  "curl -s http://127.0.0.1:8000/v1/rerank -H 'content-type: application/json' -d '{\"id\": "
  "\"u1\", \"history\": [5, 6, 7], \"candidates\": [10, 11, 12, 13, 14, 15, 16, 17, 18, 19]}'":
    ("tiny", "serve"),
  '.venv/bin/pip install "jax[cuda12]==0.10.2"': (None, "a GPU box's install (the network)"),
  '.venv/bin/python -c "import jax; print(jax.devices())"': ("tiny", {}),
  "bash scripts/setup.sh": ("tiny", {}),
}


def readme_commands() -> list[str]:
  """The shell commands of README.md's ```bash blocks, in order: continuation lines joined,
  comments dropped, spaces collapsed."""
  commands = []
  for block in re.findall(r"```bash\n(.*?)```", open(README).read(), re.S):
    for line in block.replace("\\\n", " ").splitlines():
      line = re.sub(r"\s+#.*$", "", line.strip())
      if line and not line.startswith("#"):
        commands.append(" ".join(line.split()))
  return commands


def notebook_snippet() -> str:
  return open(README).read().split("## From a notebook", 1)[1].split("```python\n", 1)[1].split(
    "```", 1)[0]


def test_every_readme_command_is_covered():
  commands = readme_commands()
  assert [c for c in commands if c not in COMMANDS] == [], "README commands this test lacks"
  assert [c for c in COMMANDS if c not in commands] == [], "commands no longer in the README"


def _checkout_entries(repo: str = REPO) -> list[str]:
  """The checkout's own top-level entries: what git tracks, and the venv setup.sh made. A user's
  files beside them (a `workdir/`, `W/`, `models/`, `requests.jsonl`) are never taken in."""
  tracked = subprocess.run(["git", "ls-files", "-z"], cwd=repo, capture_output=True, check=True)
  names = {path.split("/", 1)[0] for path in tracked.stdout.decode().split("\0") if path}
  return sorted(names | {".venv"})


def _root(directory, workdirs: dict[str, str], repo: str = REPO) -> str:
  """A directory laid out as the checkout `repo` (its own entries linked, _checkout_entries)
  with these workdirs and an empty `models/`."""
  os.makedirs(directory, exist_ok=True)
  for name in _checkout_entries(repo):
    os.symlink(os.path.join(repo, name), os.path.join(directory, name))
  for name, target in workdirs.items():
    os.symlink(target, os.path.join(directory, name))
  os.makedirs(os.path.join(directory, "models"))
  return str(directory)


def _shell(command: str, root: str, how: dict) -> subprocess.CompletedProcess:
  """Runs a README command in `root`, rewritten only by `how` (module docstring)."""
  from tests.test_chain import HF_SMOKE

  command = re.sub(r"\s\[--[^]]*\]", "", command).replace("/models/", f"{root}/models/")
  if "config" in how:
    command = re.sub(r"(--config=\S+?\.py(:\S+)?)", lambda m: m.group(1) + (
      how["config"] if m.group(2) or how["config"].startswith(":") else ""), command, count=1)
  if "replace" in how:
    command = command.replace(*how["replace"])
  if how.get("hf"):
    command += " " + " ".join(HF_SMOKE)
  path = f"{PY}:{os.environ['PATH']}"
  return subprocess.run(["bash", "-c", command], cwd=root, env={**env(), "PATH": path},
                        capture_output=True, text=True, timeout=3600)


@pytest.fixture(scope="module")
def roots(tmp_path_factory):
  """{'tiny', 'sids', 'hf': root}: the tiny root's W, W_smoke and `workdir` are the session's
  smoke workdir, the sids root's W a new one, the HF root's W and W_smoke one new workdir;
  /models/Qwen3-8B is a random Qwen3 in the HF layout."""
  from tests.hf_layout import save_qwen3_dir

  base = tmp_path_factory.mktemp("readme")
  smoke = smoke_workdir(tmp_path_factory)
  os.makedirs(base / "W_sids")
  os.makedirs(base / "W_hf")
  roots = {"tiny": _root(base / "tiny", {"W": smoke, "W_smoke": smoke, "workdir": smoke}),
           "sids": _root(base / "sids", {"W": str(base / "W_sids")}),
           "hf": _root(base / "hf", {"W": str(base / "W_hf"), "W_smoke": str(base / "W_hf")})}
  for root in roots.values():
    save_qwen3_dir(os.path.join(root, "models", "Qwen3-8B"))
  return roots


RUN = [c for c, (root, how) in COMMANDS.items() if isinstance(how, dict)]


def _setup_is_current() -> bool:
  """Whether scripts/setup.sh would install nothing (run from a linked root, an install would
  point the editable gr2jax at that root)."""
  installed = os.path.join(REPO, ".venv", ".installed")
  return os.path.isfile(installed) and all(
    os.path.getmtime(os.path.join(REPO, f)) <= os.path.getmtime(installed)
    for f in ("requirements.txt", "pyproject.toml"))


@pytest.mark.parametrize("command", RUN)
def test_readme_command_runs(roots, command):
  root, how = COMMANDS[command]
  if "scripts/setup.sh" in command and not _setup_is_current():
    pytest.skip("the venv is older than requirements.txt: run bash scripts/setup.sh first")
  result = _shell(command, roots[root], how)
  assert result.returncode == 0, result.stderr[-4000:]
  if "ar_to_diffusion" in command:
    meta = json.load(open(os.path.join(roots[root], "W", "naive", "gr2jax_metadata.json")))
    assert meta["kind"] == "diffusion"
  if "--config=eval.py" in command:
    assert glob.glob(os.path.join(roots[root], "W", "cft", "export", "eval_*_tau1.json"))


def _serve(root: str, *extra: str):
  command = next(c for c in COMMANDS if "--config=serve.py" in c)
  args = command.split()[1:]
  args[1] += SMOKE
  return subprocess.Popen([sys.executable, *args, *SERVE, *extra], cwd=root, env=env(),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.mark.parametrize("lossless", [False, True])
def test_readme_server_answers_the_curl_command(roots, lossless):
  """The serve command (plain, then lossless as its comment says), one request each: the curl
  command as written, or through httpx."""
  from gr2jax.apps.serve.client import wait_ready

  root = roots["tiny"]
  with pytest.raises(httpx.ConnectError):  # the README's port is free: our server answers
    httpx.get("http://127.0.0.1:8000/healthz")
  server = _serve(root, *([LOSSLESS] if lossless else []))
  try:
    health = wait_ready("http://127.0.0.1:8000", 1800, process=server)
    assert health["kind"] == ("lossless" if lossless else "diffusion"), health
    if lossless:
      answer = httpx.post("http://127.0.0.1:8000/v1/rerank", json=REQUEST, timeout=600).json()
    else:
      curl = next(c for c in COMMANDS if c.startswith("curl"))
      result = _shell(curl, root, {})
      assert result.returncode == 0, result.stderr
      answer = json.loads(result.stdout)
    assert len(answer.get("ranking", ())) == 10 and "reasoning" in answer, answer
  finally:
    server.send_signal(signal.SIGTERM)
    server.wait(120)


def test_readme_notebook_snippet_runs(roots):
  root = roots["tiny"]
  with open(os.path.join(root, "requests.jsonl"), "w") as f:
    f.write(json.dumps(REQUEST) + "\n")
  result = subprocess.run([sys.executable, "-c", notebook_snippet()], cwd=root, env=env(),
                          capture_output=True, text=True, timeout=1800)
  assert result.returncode == 0, result.stderr[-4000:]
  assert "(1, 32)" in result.stdout
