"""Policies named from outside psgate: specs, their checks, the receipt's record of the
code, verify against changed code, and a user's policy that raises mid-replay."""

from __future__ import annotations

import csv
import io
import json
import textwrap
from pathlib import Path

import pytest

from psgate.errors import InputError
from psgate.policies import make_policy, policy_names, resolve
from psgate.policy import API_VERSION

from helpers import ledger_csv
from test_cli import assert_one_line_error, psgate, small_trace

# A user's policy: lru's order, its own code (no psgate module but the API).
OWN = '''
from psgate.policy import BlockQueues, Decision, EvictionPolicy


class FreshFirst(EvictionPolicy):
    """Evict the least recently freed candidate (lru's rule, written out)."""

    name = "fresh-first"
    api_version = 1
    summary = "lru, as a user writes it"
    defaults = {"tag": "x"}

    def bind(self, pool):
        super().bind(pool)
        self.q = BlockQueues(pool.num_blocks, 1)

    def on_free(self, blocks, now_ns):
        for b in blocks:
            self.q.append(0, b)

    def on_touch(self, block):
        self.q.remove(block)

    def select_victim(self, req, now_ns):
        b = self.q.head(0)
        return Decision(victim=b, num_candidates=self.q.sizes[0], position=0, queue="fifo",
                        rank={"tag": self.params["tag"]})

    def on_evict(self, block):
        self.q.remove(block)

    @property
    def num_candidates(self):
        return self.q.sizes[0]

    def candidates(self):
        return self.q.items(0)
'''


def write_package(root: Path, pkg: str = "ownpol", dist: str = "own-pol",
                  entry: str | None = "fresh-first", body: str = OWN) -> Path:
    """``pkg`` on a directory that goes on sys.path, with a dist-info declaring the
    entry point ``entry`` (what ``pip install`` of a package with one leaves)."""
    (root / pkg).mkdir(parents=True, exist_ok=True)
    (root / pkg / "__init__.py").write_text("")
    (root / pkg / "policy.py").write_text(body)
    if entry is not None:
        info = root / f"{dist.replace('-', '_')}-1.2.3.dist-info"
        info.mkdir(exist_ok=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.2.3\n")
        (info / "entry_points.txt").write_text(
            f"[psgate.policies]\n{entry} = {pkg}.policy:FreshFirst\n")
        (info / "top_level.txt").write_text(pkg + "\n")
        (info / "RECORD").write_text("")
    return root


@pytest.fixture
def site(tmp_path, monkeypatch):
    root = write_package(tmp_path / "site")
    monkeypatch.syspath_prepend(str(root))
    return root


def test_the_four_ways_of_naming_a_policy(site, tmp_path, monkeypatch):
    builtin = resolve("lru")
    assert (builtin.kind, builtin.distribution, builtin.files) == \
        ("builtin", "psgate", ("psgate/policies/lru.py",))
    ep = resolve("fresh-first")
    assert (ep.kind, ep.entry_point, ep.distribution, ep.version) == \
        ("entry-point", "fresh-first", "own-pol", "1.2.3")
    assert ep.files == ("ownpol/__init__.py", "ownpol/policy.py")
    mod = resolve("ownpol.policy:FreshFirst")
    assert mod.kind == "module" and mod.cls is ep.cls and mod.sha256 == ep.sha256
    monkeypatch.chdir(tmp_path)
    f = resolve("site/ownpol/policy.py:FreshFirst")
    assert f.kind == "file" and f.files == ("site/ownpol/policy.py",)
    assert f.to_json()["class"] == "site/ownpol/policy.py:FreshFirst"
    assert f.cls is not ep.cls              # the file is its own module
    p = make_policy("fresh-first", {"tag": "y"})
    assert p.params == {"tag": "y"} and p.name == "fresh-first"


def test_the_digest_follows_the_code(site, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    other = tmp_path / "b.py"
    other.write_text(OWN)
    before = resolve("b.py:FreshFirst").sha256
    other.write_text(OWN + "\n# a comment is code too\n")
    again = resolve("b.py:FreshFirst")
    assert again.sha256 != before
    assert again.cls.__module__ != resolve("ownpol.policy:FreshFirst").cls.__module__


def test_a_builtin_name_wins_over_an_entry_point_and_says_so(tmp_path, monkeypatch):
    root = write_package(tmp_path / "site2", pkg="shadowing", dist="shadowing", entry="lru")
    monkeypatch.syspath_prepend(str(root))
    src = resolve("lru")
    assert src.kind == "builtin"
    assert any("shadowed" in n and "shadowing.policy:FreshFirst" in n for n in src.notes)
    # qualified, the package's class is reached (its name differs from the entry point's,
    # which only a plain name would refuse)
    assert resolve("shadowing.policy:FreshFirst").kind == "module"


BAD = {
    "missing module": ("no_such_module_xyz:Cls", "no module named 'no_such_module_xyz'"),
    "missing file": ("nope/missing.py:Cls", "no such file 'nope/missing.py'"),
    "syntax error": ("bad_syntax.py:Cls", "bad_syntax.py:2: syntax error"),
    "raises on import": ("raising.py:Cls", "importing it raised RuntimeError: boom"),
    "no such class": ("good.py:Nope", "has no attribute 'Nope'; policy classes defined "
                                      "there: Good"),
    "not a policy": ("good.py:helper", "expected a subclass of psgate.policy.EvictionPolicy, "
                                       "found function"),
    "abstract": ("abstract.py:Half", "Half does not implement num_candidates, on_evict"),
    "no name": ("noname.py:Nameless", "declares no name"),
    "no api version": ("noversion.py:Old", "declares no policy API version"),
    "newer api": ("newer.py:Future", f"written for policy API version {API_VERSION + 1}"),
    "bad syntax of the spec": ("a b:C", "is neither a module name nor a .py file"),
    "unknown name": ("no-such-policy", "no such policy; built-in: arc, belady"),
}


def bad_files(d: Path) -> None:
    good = OWN.replace("class FreshFirst", "class Good").replace('"fresh-first"', '"good"')
    (d / "good.py").write_text(good + "\n\ndef helper():\n    pass\n")
    (d / "bad_syntax.py").write_text("import os\nclass Cls(:\n")
    (d / "raising.py").write_text("raise RuntimeError('boom')\n")
    (d / "abstract.py").write_text(textwrap.dedent('''
        from psgate.policy import EvictionPolicy
        class Half(EvictionPolicy):
            name = "half"
            api_version = 1
            def on_touch(self, b): pass
            def on_free(self, bs, now): pass
            def select_victim(self, req, now): pass
        '''))
    for fname, cls, attrs in (("noname.py", "Nameless", ""),
                              ("noversion.py", "Old", 'name = "old"'),
                              ("newer.py", "Future",
                               f'name = "future"\n    api_version = {API_VERSION + 1}')):
        (d / fname).write_text(good.replace("class Good", f"class {cls}")
                               .replace('name = "good"\n    api_version = 1', attrs))


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_spec_is_one_line_exit_2(tmp_path, case):
    spec, needle = BAD[case]
    bad_files(tmp_path)
    trace = small_trace(tmp_path)
    proc = psgate("replay", "--trace", trace, "--baseline", "lru", "--candidate", spec,
                  "--out", tmp_path / "o", cwd=tmp_path)
    assert_one_line_error(proc, 2, f"--candidate: policy '{spec}': ", needle)
    assert not (tmp_path / "o").exists()


def test_parameters_are_checked_by_the_policys_defaults(site):
    with pytest.raises(InputError, match="unknown parameter.*'fresh-first': nope"):
        make_policy("fresh-first", {"nope": 1}, "--candidate-param")


def test_an_entry_point_whose_name_is_not_the_class_name_is_refused(tmp_path, monkeypatch):
    root = write_package(tmp_path / "site3", pkg="misnamed", dist="misnamed", entry="other")
    monkeypatch.syspath_prepend(str(root))
    with pytest.raises(InputError, match="names misnamed.policy:FreshFirst, whose name is "
                                         "'fresh-first'; the two must agree"):
        resolve("other")


def test_two_packages_with_one_name_are_ambiguous(tmp_path, monkeypatch):
    for pkg in ("twin_a", "twin_b"):
        monkeypatch.syspath_prepend(str(write_package(tmp_path / pkg, pkg=pkg, dist=pkg)))
    with pytest.raises(InputError, match="several installed packages register this name"):
        resolve("fresh-first")


def test_the_receipt_records_the_code_and_verify_holds_it_to_it(tmp_path):
    """Replay by file spec; verify passes while the file is unchanged and exits 5, naming
    the run and the digests, once it changed (the replay itself still identical)."""
    (tmp_path / "own.py").write_text(OWN)
    trace = small_trace(tmp_path)
    out = tmp_path / "o"
    proc = psgate("replay", "--trace", trace, "--baseline", "lru", "--candidate",
                  "own.py:FreshFirst", "--capacity", "8", "--out", out, "--quiet",
                  cwd=tmp_path)
    assert proc.returncode in (0, 1), proc.stderr
    receipt = json.loads((out / "receipt.json").read_text())
    src = receipt["config"]["candidate"]["source"]
    assert src["kind"] == "file" and src["spec"] == "own.py:FreshFirst"
    assert src["class"] == "own.py:FreshFirst" and src["files"] == ["own.py"]
    assert receipt["config"]["baseline"]["source"]["kind"] == "builtin"
    assert receipt["environment"]["policy_files"]["candidate"] == [str(tmp_path / "own.py")]
    ok = psgate("verify", out, cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    # explain replays the candidate with the same code to list every candidate
    rows = list(csv.DictReader(io.StringIO(ledger_csv(out).decode())))
    seq = next(r["seq"] for r in rows if r["run"] == "candidate" and r["kind"] == "evict")
    why = psgate("explain", out, "--decision", seq, "--candidates", cwd=tmp_path)
    assert why.returncode == 0, why.stderr
    assert "policy fresh-first" in why.stdout and "Ranking fields: tag=x" in why.stdout
    assert "All 6 candidates at that moment, as fresh-first lists them" in why.stdout
    (tmp_path / "own.py").write_text(OWN + "\n# changed\n")
    changed = psgate("verify", out, cwd=tmp_path)
    assert changed.returncode == 5, changed.stderr
    assert "candidate policy 'own.py:FreshFirst': the code is not the receipt's: source " \
           "SHA-256" in changed.stderr
    assert "with the code here" in changed.stderr and "identical on replay" in changed.stderr
    doc = json.loads(changed.stdout)
    assert doc["verified"] is False and len(doc["policy_changes"]) == 1
    # a behaviour change too: the first difference is named beside the code change
    (tmp_path / "own.py").write_text(OWN.replace("b = self.q.head(0)", "b = self.q.items(0)[-1]"))
    diff = psgate("verify", out, cwd=tmp_path)
    assert diff.returncode == 5, diff.stderr
    assert "NOT verified: receipt.json/" in diff.stderr, diff.stderr


def test_an_edited_record_of_the_code_is_not_verified(tmp_path):
    (tmp_path / "own.py").write_text(OWN)
    trace = small_trace(tmp_path)
    out = tmp_path / "o"
    assert psgate("replay", "--trace", trace, "--baseline", "lru", "--candidate",
                  "own.py:FreshFirst", "--out", out, "--quiet", "--allow-unexercised",
                  cwd=tmp_path).returncode in (0, 1)
    path = out / "receipt.json"
    receipt = json.loads(path.read_text())
    receipt["config"]["candidate"]["source"]["sha256"] = "0" * 64
    path.write_text(json.dumps(receipt, indent=2))
    proc = psgate("verify", out, cwd=tmp_path)
    assert proc.returncode == 5 and "0000000000000000... in the receipt" in proc.stderr


def test_a_users_policy_that_raises_fails_the_gate_by_name(tmp_path):
    """Not a traceback and not exit 2: the candidate's run is aborted with the exception
    and where it was raised, and the gate fails (exit 1)."""
    body = OWN.replace("        b = self.q.head(0)\n",
                       "        b = self.q.head(0)\n        if b >= 0:\n"
                       "            raise KeyError('lost track')\n")
    (tmp_path / "raiser.py").write_text(body)
    trace = small_trace(tmp_path)
    proc = psgate("replay", "--trace", trace, "--baseline", "lru", "--candidate",
                  "raiser.py:FreshFirst", "--capacity", "8", "--out", tmp_path / "o",
                  "--quiet", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    receipt = json.loads((tmp_path / "o" / "receipt.json").read_text())
    aborted = receipt["runs"]["candidate"]["aborted"]
    assert aborted.startswith("policy 'fresh-first' raised KeyError: 'lost track' in "
                              "select_victim (")
    assert str(tmp_path / "raiser.py") in aborted
    assert receipt["gate"]["result"] == "fail"


def test_psgates_own_fault_is_not_blamed_on_a_builtin_policy(monkeypatch):
    """Only a user's code is answered for by the run: an exception in psgate's code
    (here a built-in policy's) propagates as before."""
    from psgate.engines.base import policy_fault
    pol = make_policy("lru")
    try:
        pol.on_touch(10**9)
    except Exception as exc:    # noqa: BLE001
        assert policy_fault(pol, exc) is None
    else:
        pytest.fail("expected an IndexError")


def test_policies_lists_builtins_entry_points_and_given_specs(site, tmp_path):
    env = {"PYTHONPATH": str(site)}
    proc = psgate("policies", "--json", "site/ownpol/policy.py:FreshFirst", cwd=tmp_path,
                  env=env)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    rows = {(r["name"], r["kind"]): r for r in doc["policies"]}
    assert doc["api_version"] == API_VERSION
    for name in policy_names():
        assert (name, "builtin") in rows
    ep = rows[("fresh-first", "entry-point")]
    assert (ep["distribution"], ep["version"], ep["params"]) == ("own-pol", "1.2.3",
                                                                 {"tag": "x"})
    f = rows[("fresh-first", "file")]
    assert f["class"] == "site/ownpol/policy.py:FreshFirst"


def test_a_sweep_checks_a_candidate_spec_before_any_cell(tmp_path):
    proc = psgate("sweep", "--workload", "one-touch", "--baseline", "lru", "--axis",
                  "candidate=lru,nope.py:X", "--runs", "2", "--out", tmp_path / "sw",
                  cwd=tmp_path)
    assert_one_line_error(proc, 2, "policy 'nope.py:X': no such file")


def test_a_users_policy_that_raises_in_bind_is_one_line_exit_2(tmp_path):
    body = OWN.replace("        self.q = BlockQueues(pool.num_blocks, 1)\n",
                       "        raise ValueError('needs a GPU')\n")
    (tmp_path / "nobind.py").write_text(body)
    proc = psgate("replay", "--trace", small_trace(tmp_path), "--baseline", "lru",
                  "--candidate", "nobind.py:FreshFirst", "--out", tmp_path / "o", cwd=tmp_path)
    assert_one_line_error(proc, 2, "policy 'fresh-first' raised ValueError: needs a GPU in bind")
    assert not (tmp_path / "o").exists()
