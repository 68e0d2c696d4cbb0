"""examples/own-policy: a policy package psgate has never seen, installed into a fresh
virtualenv and used as its README says.

Each test makes a fresh virtualenv in tmp_path and installs the example into it with pip,
from a copy of its directory (the build leaves ``build/`` and ``*.egg-info`` in the
source tree: in the copy, not in the repository). Then the README's commands run, as
written, in a directory laid out like the repository's root, with the new virtualenv's
``bin`` first on PATH; and the example's CI workflow is linted and its psgate steps run.
Nothing here needs the network or anything beside the repository and psgate's test
extra (whose setuptools, 77 or later, builds the example).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
import xml.etree.ElementTree as ET
from importlib import metadata
from pathlib import Path

import pytest

from helpers import assert_actionlint, shell_blocks

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "own-policy"
README = EXAMPLE / "README.md"
WORKFLOW = EXAMPLE / "ci" / "gate.yml"
INCIDENT = ROOT / "examples" / "ci" / "incident.jsonl"
PROJECT = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())["project"]
POLICY_FILE = "examples/own-policy/src/quota_lru/policy.py"

# The README's install command, and how it runs here: offline, with psgate and the
# build backend (setuptools) already importable, so nothing is fetched.
INSTALL = "pip install ./examples/own-policy"
OFFLINE = ["--no-deps", "--no-build-isolation"]
PROGRAM = re.compile(r"^(pip|psgate|python3?)\s")
EXPECT = re.compile(r"\s+#\s*exit (\d+)\s*$")


def readme_commands() -> list[tuple[str, int]]:
    """Every command of the README's code blocks, in order, with the exit code it must
    give: N where the line ends in ``# exit N``, else 0."""
    cmds = []
    for block in shell_blocks(README.read_text()):
        for line in block:
            m = EXPECT.search(line)
            cmd = line[:m.start()] if m else line
            if PROGRAM.match(cmd.strip() + " "):
                cmds.append((cmd.strip(), int(m.group(1)) if m else 0))
    return cmds


def _option(cmd: str, name: str) -> str:
    words = shlex.split(cmd)
    return words[words.index(name) + 1]


def _offline(cmd: str) -> str:
    """A ``pip install`` command with the offline options added after ``install``."""
    assert cmd.startswith("pip install "), cmd
    return "pip install " + " ".join(OFFLINE) + cmd[len("pip install"):]


class Venv:
    """A fresh virtualenv in which psgate is importable without being reinstalled.

    ``python -m venv --without-pip`` makes an empty one; a ``.pth`` file in its
    site-packages adds this interpreter's site-packages directories (``site.addsitedir``,
    so their own ``.pth`` files run too, such as an editable install's finder). So the
    psgate already installed here, with its compiled core, is the one the new
    virtualenv runs, with its dependencies, pip and setuptools; and the example is
    installed into the new virtualenv's own site-packages, which comes first on its
    path, leaving this environment untouched. ``bin/psgate`` and ``bin/pip`` are the
    launchers pip would have written, running the new interpreter."""

    def __init__(self, where: Path) -> None:
        self.dir = where
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)],
                       check=True, capture_output=True, timeout=120)
        self.bin = where / "bin"
        self.python = self.bin / "python"
        self.site = Path(subprocess.run(
            [str(self.python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
            check=True, capture_output=True, text=True, timeout=60).stdout.strip())
        ours = [p for p in sys.path if Path(p).name in ("site-packages", "dist-packages")
                and Path(p).is_dir()]
        (self.site / "psgate-test-env.pth").write_text(
            "".join(f"import site; site.addsitedir({p!r})\n" for p in ours))
        for name, module in (("psgate", "psgate"), ("pip", "pip")):
            launcher = self.bin / name
            launcher.write_text(f'#!/bin/sh\nexec "{self.python}" -m {module} "$@"\n')
            launcher.chmod(0o755)

    def env(self, **extra: str) -> dict:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
        env.update(PATH=str(self.bin) + os.pathsep + env.get("PATH", ""),
                   VIRTUAL_ENV=str(self.dir), PIP_NO_INDEX="1", PIP_NO_INPUT="1",
                   PIP_DISABLE_PIP_VERSION_CHECK="1", NO_COLOR="1", COLUMNS="160", **extra)
        return env

    def run(self, cmd: str, cwd: Path, timeout: int = 600, **extra: str):
        return subprocess.run(["bash", "-c", cmd], cwd=cwd, env=self.env(**extra),
                              capture_output=True, text=True, timeout=timeout)


def _tree(path: Path) -> list[tuple[str, int]]:
    """Every file and folder under path with its modification time (bytecode aside)."""
    return sorted((str(p.relative_to(path)), p.stat().st_mtime_ns) for p in path.rglob("*")
                  if "__pycache__" not in p.parts)


def _copy_example(dest: Path) -> Path:
    shutil.copytree(EXAMPLE, dest, ignore=shutil.ignore_patterns(
        "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache"))
    return dest


def _needs_a_modern_setuptools() -> None:
    """The example's build backend is setuptools >= 77 (its SPDX licence field), which
    psgate's test extra installs; the copy here is what pip builds the example with."""
    version = metadata.version("setuptools")
    if tuple(int(x) for x in version.split(".")[:2]) < (77, 0):
        pytest.fail(f"setuptools {version} here cannot build examples/own-policy offline: "
                    f"it needs >= 77, which psgate's test extra installs "
                    f"(pip install -e '.[test]')")


@pytest.fixture(scope="module")
def readme_run(tmp_path_factory):
    """Every README command run in order in one directory laid out like the repository's
    root: (the venv, that directory, [(command, expected exit, completed process)])."""
    _needs_a_modern_setuptools()
    tmp = tmp_path_factory.mktemp("own-policy")
    venv = Venv(tmp / "venv")
    root = tmp / "repo"
    _copy_example(root / "examples" / "own-policy")
    before = _tree(EXAMPLE)
    ran = []
    for cmd, expected in readme_commands():
        proc = venv.run(_offline(cmd) if cmd == INSTALL else cmd, cwd=root)
        ran.append((cmd, expected, proc))
        assert proc.returncode == expected, (cmd, proc.returncode, proc.stdout[-2000:],
                                             proc.stderr[-4000:])
    assert _tree(EXAMPLE) == before, "the README's commands changed examples/own-policy"
    return venv, root, ran


def test_readme_names_each_step():
    """The README shows each thing a user does with the package, and only the bad
    setting fails."""
    cmds = readme_commands()
    text = [c for c, _ in cmds]
    assert text.count(INSTALL) == 1 and text[0] == INSTALL, text
    for wanted in ("psgate policies", "psgate check-policy quota-lru"):
        assert wanted in text, wanted
    replays = {_option(c, "--candidate"): (c, code) for c, code in cmds
               if c.startswith("psgate replay ") and "--candidate-param" not in c}
    assert set(replays) == {"quota-lru", "quota_lru.policy:QuotaLRU",
                            f"{POLICY_FILE}:QuotaLRU"}, replays
    assert all(code == 0 for _, code in replays.values())
    failing = [c for c, code in cmds if code != 0]
    assert len(failing) == 1 and failing[0].startswith("psgate replay "), failing
    assert "--candidate-param" in failing[0] and dict(cmds)[failing[0]] == 1
    for sub in ("psgate verify ", "psgate explain "):
        assert any(c.startswith(sub) for c in text), sub
    assert any("--decision" in c for c in text) and any("--request" in c for c in text)
    assert (EXAMPLE / POLICY_FILE.split("examples/own-policy/")[1]).is_file()


def test_readme_commands_run_as_written(readme_run):
    venv, root, ran = readme_run
    out = {cmd: proc for cmd, _, proc in ran}
    listed = out["psgate policies"]
    assert "quota-lru" in listed.stdout + listed.stderr
    # the package went into the fresh virtualenv, not into this environment
    assert (venv.site / "quota_lru" / "policy.py").is_file()
    with pytest.raises(metadata.PackageNotFoundError):
        metadata.version(PROJECT["name"])
    # ... and was built in the copy (the repository's tree is checked by the fixture)
    assert list(root.glob("examples/own-policy/src/*.egg-info"))


def _outs(ran) -> dict[str, str]:
    """The README's replays: --candidate (with " starved" for the bad setting) -> --out."""
    return {_option(c, "--candidate") + (" starved" if "--candidate-param" in c else ""):
            _option(c, "--out") for c, _, _ in ran if c.startswith("psgate replay ")}


def _load(root: Path, out: str) -> dict:
    return json.loads((root / out / "receipt.json").read_text())


def test_receipts_record_how_the_policy_was_named(readme_run):
    venv, root, ran = readme_run
    outs = _outs(ran)
    ep = _load(root, outs["quota-lru"])["config"]["candidate"]["source"]
    assert ep["kind"] == "entry-point" and ep["entry_point"] == "quota-lru"
    assert (ep["distribution"], ep["version"]) == (PROJECT["name"], PROJECT["version"])
    assert ep["class"] == "quota_lru.policy:QuotaLRU"
    assert ep["files"] == ["quota_lru/__init__.py", "quota_lru/policy.py"]
    mod = _load(root, outs["quota_lru.policy:QuotaLRU"])["config"]["candidate"]["source"]
    assert mod["kind"] == "module" and mod["distribution"] == PROJECT["name"]
    assert mod["sha256"] == ep["sha256"]          # the same installed files
    spec = f"{POLICY_FILE}:QuotaLRU"
    file = _load(root, outs[spec])["config"]["candidate"]["source"]
    assert file["kind"] == "file" and file["file"] == POLICY_FILE
    assert file["files"] == [POLICY_FILE]
    # the three replays ran the same policy: same gate, same per-request outcomes
    gates = {s: _load(root, outs[s])["gate"]
             for s in ("quota-lru", "quota_lru.policy:QuotaLRU", spec)}
    assert all(g["result"] == "pass" for g in gates.values())
    assert len({json.dumps(g["checks"], sort_keys=True) for g in gates.values()}) == 1
    assert len({(root / outs[s] / "requests.csv").read_bytes() for s in gates}) == 1


def test_the_bad_setting_fails_on_the_tenant_it_starves(readme_run):
    venv, root, ran = readme_run
    outs = _outs(ran)
    starved = _load(root, outs["quota-lru starved"])
    failed = [c for c in starved["gate"]["checks"] if c["verdict"] != "pass"]
    assert failed and {c["select"] for c in failed} == {"group:tenant-b"}, failed
    assert {c["metric"] for c in failed} == {"hit_fraction", "saved_prefill_tokens"}
    stderr = next(p.stderr for c, _, p in ran if "--candidate-param" in c)
    assert "FAIL non-regression hit_fraction (group:tenant-b)" in " ".join(stderr.split())
    # the README's measured numbers are the receipts'
    text = " ".join(README.read_text().split())
    good = _load(root, outs["quota-lru"])

    def pair(receipt, scope, metric, fmt):
        runs = receipt["runs"]
        vals = [runs[r]["metrics"]["totals"] if scope == "all" else
                runs[r]["metrics"]["groups"][scope] for r in ("baseline", "candidate")]
        return f"{fmt(vals[0][metric])} -> {fmt(vals[1][metric])}"

    four = "{:.4f}".format
    for receipt, scope, metric, fmt in [
            (good, "all", "hit_fraction", four), (good, "tenant-a", "hit_fraction", four),
            (good, "tenant-b", "hit_fraction", four), (good, "all", "saved_prefill_tokens", str),
            (starved, "all", "hit_fraction", four), (starved, "tenant-b", "hit_fraction", four),
            (starved, "tenant-b", "saved_prefill_tokens", str)]:
        assert pair(receipt, scope, metric, fmt) in text, (scope, metric)


def test_explain_shows_the_ranking_fields(readme_run):
    venv, root, ran = readme_run
    decision = next(p.stdout for c, _, p in ran if "--decision" in c)
    assert "policy quota-lru" in decision and "rule=over-quota" in decision
    assert "group=tenant-x" in decision and "quota=" in decision and "holding=" in decision
    request = " ".join(next(p.stdout for c, _, p in ran if "--request" in c).split())
    assert "group tenant-b" in request and "evicted by tenant-x's requests" in request
    assert "tenant-b/own" in request          # the queue of the over-quota rule's victims


def test_verify_tells_the_policy_code_changed(readme_run):
    venv, root, ran = readme_run
    outs = _outs(ran)
    file_receipt, ep_receipt = outs[f"{POLICY_FILE}:QuotaLRU"], outs["quota-lru"]
    for out in (file_receipt, ep_receipt):
        proc = venv.run(f"psgate verify {out}", cwd=root)
        assert proc.returncode == 0, proc.stderr
    # the file the file spec names: its receipt no longer verifies, the installed one does
    with open(root / POLICY_FILE, "a") as f:
        f.write("# edited after the receipt\n")
    proc = venv.run(f"psgate verify {file_receipt}", cwd=root)
    assert proc.returncode == 5, (proc.returncode, proc.stderr)
    assert "NOT verified" in proc.stderr and json.loads(proc.stdout)["policy_changes"]
    assert venv.run(f"psgate verify {ep_receipt}", cwd=root).returncode == 0
    # the installed package's code: the entry point's receipt no longer verifies
    with open(venv.site / "quota_lru" / "policy.py", "a") as f:
        f.write("# edited after the receipt\n")
    proc = venv.run(f"psgate verify {ep_receipt}", cwd=root)
    assert proc.returncode == 5, (proc.returncode, proc.stderr)
    assert "NOT verified" in proc.stderr


# -- the CI workflow ---------------------------------------------------------------------
def test_workflow_passesactionlint_path():
    assert_actionlint(WORKFLOW)


def test_workflow_steps_run_in_a_policy_repository(tmp_path):
    """The workflow's steps in order, in a copy of the package laid out as its own
    repository with the incident stored at traces/incident.jsonl: psgate comes from
    this checkout (its install step is the one not run), the package is installed by the
    workflow's own step (offline), check-policy passes and the gate passes."""
    import yaml                       # pyyaml: in psgate's test extra

    _needs_a_modern_setuptools()
    workflow = yaml.safe_load(WORKFLOW.read_text())
    steps = workflow["jobs"]["gate"]["steps"]
    repo = _copy_example(tmp_path / "policy-repo")
    (repo / "traces").mkdir()
    shutil.copy(INCIDENT, repo / "traces" / "incident.jsonl")
    venv = Venv(tmp_path / "venv")
    summary = tmp_path / "step-summary.md"
    summary.write_text("")
    env = {k: str(v) for k, v in workflow["env"].items()}
    runs = [s["run"] for s in steps if "run" in s]
    assert runs[0] == 'pip install "$PSGATE_SOURCE"' and runs[1] == "pip install ."
    assert "psgate" in env["PSGATE_SOURCE"] and env["POLICY"] == "quota-lru"
    for cmd in runs[1:]:
        cmd = _offline(cmd) if cmd.startswith("pip install") else cmd
        proc = venv.run(cmd, cwd=repo, GITHUB_STEP_SUMMARY=str(summary), **env)
        assert proc.returncode == 0, (cmd, proc.stdout[-2000:], proc.stderr[-4000:])
    assert "### psgate gate: PASS" in summary.read_text()
    receipt = json.loads((repo / "receipt" / "receipt.json").read_text())
    assert receipt["config"]["candidate"]["source"]["kind"] == "entry-point"
    assert receipt["trace"]["path"] == "traces/incident.jsonl"
    upload = next(s for s in steps if s.get("uses", "").startswith("actions/upload-artifact@"))
    kept = upload["with"]["path"].split()
    for path in kept:
        assert (repo / path).exists(), path
    for junit in (p for p in kept if p.endswith(".xml")):
        root = ET.parse(repo / junit).getroot()
        suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
        assert sum(int(s.get("tests")) for s in suites) > 0
        assert all(s.get("failures") == "0" for s in suites), junit
