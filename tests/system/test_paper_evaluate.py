"""The pre-registered evaluation (examples/paper/protocol.toml, evaluate.py): the committed
protocol loads and keeps its held-out runs apart from its tuning runs, the held-out set
refuses rule parameters, bad protocols are one-line errors with exit 2, and a small
protocol runs end to end (numbers checked against replays made here), its report section
replacing itself between the markers. The full sets are documented commands, not run here.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from psgate.contracts import CONTRACT_NAMES
from psgate.engines import engine_class
from psgate.engines.cost import CostModel
from psgate.policies import make_policy
from psgate.stats.metrics import run_metrics
from psgate.trace.future import future_uses
from psgate.trace.reader import HashTable, TraceReader, TraceSource, validate_trace
from psgate.trace.writer import write_trace
from psgate.workloads import generate

ROOT = Path(__file__).resolve().parents[2]
PAPER_DIR = ROOT / "examples" / "paper"
sys.path.insert(0, str(PAPER_DIR))

import evaluate  # noqa: E402

# A one-touch small enough for a test (replayed under the step scheduler, rates=step).
SMALL = {"attack_requests": 24, "warmup_s": 2.0, "cooldown_s": 1.0}


def _run(*args, cwd=ROOT):
    return subprocess.run([sys.executable, str(PAPER_DIR / "evaluate.py"), *args],
                          capture_output=True, text=True, cwd=cwd, timeout=600)


def _protocol(tmp_path: Path, cells: str, name: str = "p.toml") -> Path:
    text = (PAPER_DIR / "protocol.toml").read_text()
    head = text[:text.index("[[tuning]]")]
    p = tmp_path / name
    p.write_text(head + cells)
    return p


def test_the_committed_protocol_loads_and_its_heldout_seeds_are_not_tuning_seeds():
    proto = evaluate.load_protocol(evaluate.PROTOCOL)
    assert proto["rule"]["policy"] == "prefixshield-b"
    assert make_policy("prefixshield-b").params == {
        **make_policy("prefixshield-b").params, **proto["rule"]["params"]}
    tuned = {(c["workload"], s) for c in proto["tuning"] if "workload" in c
             for s in evaluate._seeds(c)}
    held = {(c["workload"], s) for c in proto["heldout"] if "workload" in c
            for s in evaluate._seeds(c)}
    assert held and tuned and not held & tuned
    assert min(s for _, s in held) >= 100
    kinds = {c["kind"] for c in proto["heldout"]}
    assert kinds == {"attack", "benign"}


def test_a_protocol_whose_heldout_seeds_were_tuned_on_is_refused(tmp_path):
    cells = ('[[tuning]]\nname = "a"\nkind = "attack"\nworkload = "one-touch"\n'
             'seeds = [0, 4]\ncapacities = [512]\n'
             '[[heldout]]\nname = "b"\nkind = "attack"\nworkload = "one-touch"\n'
             'seeds = [3, 4]\ncapacities = [512]\n')
    r = _run("--protocol", str(_protocol(tmp_path, cells)))
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "seeds [3] are tuning seeds" in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("cells,needle", [
    ('[[tuning]]\nname = "a"\nkind = "soft"\nworkload = "one-touch"\nseeds = [0, 2]\n'
     'capacities = [512]\n[[heldout]]\n', "tuning[0].kind: expected 'attack' or 'benign'"),
    ('[[tuning]]\nname = "a"\nkind = "attack"\nworkload = "no-such"\nseeds = [0, 2]\n'
     'capacities = [512]\n[[heldout]]\n', "tuning[0].workload: unknown generator"),
    ('[[tuning]]\nname = "a"\nkind = "attack"\nworkload = "one-touch"\nseeds = [0, 1]\n'
     'capacities = [512]\n[[heldout]]\n', "expected [first, count >= 2]"),
    ('[[tuning]]\nname = "a"\nkind = "attack"\n[[heldout]]\n', "tuning[0]: missing 'capacities'"),
    ('[[tuning]\n', "p.toml:"),
])
def test_bad_protocols_are_one_line_errors(tmp_path, cells, needle):
    r = _run("--protocol", str(_protocol(tmp_path, cells)))
    assert r.returncode == 2, r.stderr
    assert needle in r.stderr and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr


def test_the_heldout_set_runs_the_registered_rule_only():
    r = _run("--rule-params", '{"output_weight": 1.0}')
    assert r.returncode == 2
    assert "the held-out set runs the registered rule only" in r.stderr
    r = _run("--set", "tuning", "--rule-params", "[1]")
    assert r.returncode == 2 and "expected a JSON object" in r.stderr


def _hit(path: Path, policy: str, params: dict, cap: int, role: str | None) -> float:
    hashes = HashTable()
    header, summary = validate_trace(str(path), hashes)
    pol = make_policy(policy, params)
    if pol.needs_future:
        pol.set_future(future_uses(TraceSource(str(path), path), hashes))
    eng = engine_class("sim", "step")(header=header, hashes=hashes, capacity=cap,
                                      policy=pol,
                                      contracts=CONTRACT_NAMES, done_ids=summary.done_ids,
                                      groups=summary.groups, cost=CostModel())
    with TraceReader(TraceSource(str(path), path), hashes) as reader:
        m = run_metrics(eng.run(reader.events()), CostModel())
    return (m["roles"][role] if role else m["totals"])["hit_fraction"]


def test_a_small_protocol_runs_end_to_end_and_rewrites_its_report_section(tmp_path):
    params = ", ".join(f"{k} = {v}" for k, v in SMALL.items())
    cells = ('[[tuning]]\nname = "t"\nkind = "attack"\nworkload = "one-touch"\n'
             f'params = {{ {params} }}\nseeds = [0, 2]\ncapacities = [256]\n'
             '[[heldout]]\nname = "small one-touch"\nkind = "attack"\n'
             f'workload = "one-touch"\nparams = {{ {params} }}\nseeds = [100, 2]\n'
             'capacities = [256]\n'
             '[[heldout]]\nname = "small weka"\nkind = "benign"\nformat = "weka"\n'
             'source = "repo:examples/traces/weka-small"\n'
             'sessions = { by = "size", skip = 0, count = 4, exclude_every = 0 }\n'
             'bundles = 2\ncapacities = [256]\n')
    proto = _protocol(tmp_path, cells)
    report = tmp_path / "REPORT.md"
    report.write_text("# A report\n\nbody\n")
    out = tmp_path / "out"
    r = _run("--protocol", str(proto), "--out", str(out), "--report", str(report),
             "--workers", "1")
    assert r.returncode in (0, 1), r.stderr
    res = json.loads((out / "results.json").read_text())
    assert res["set"] == "heldout" and not res["skipped"]
    one_touch, weka = res["cells"]
    assert one_touch["runs"] == ["seed 100", "seed 101"] and len(weka["runs"]) == 2
    # the numbers are those of the same replays made here
    for seed, got in zip((100, 101), one_touch["values"]["rule"]):
        path = tmp_path / f"ot-{seed}.jsonl"
        write_trace(path, generate("one-touch", {**SMALL, "seed": seed, "rates": "step"},
                                   cost=CostModel()))
        assert got == round(_hit(path, "prefixshield-b", {}, 256, "victim"), 6)
        assert one_touch["values"]["lru"][seed - 100] == round(
            _hit(path, "lru", {}, 256, "victim"), 6)
    # the verdicts follow the criteria from the values
    m = weka["means_pct"]
    assert weka["met"] == (m["rule"] - max(m["lru"], m["s3fifo"]) >= -0.5)
    low = one_touch["paired"]["prefixshield"]["ci_pp"][0]
    assert one_touch["met"] == (low >= -0.1)
    assert r.returncode == (0 if one_touch["met"] and weka["met"] else 1)
    text = report.read_text()
    assert text.startswith("# A report\n\nbody\n")
    assert text.count(evaluate.BEGIN) == 1 and text.count(evaluate.END) == 1
    assert "| small one-touch | attack | 256 | 2 |" in text
    # a second run replaces the section instead of adding one
    r2 = _run("--protocol", str(proto), "--out", str(out), "--report", str(report),
              "--workers", "1", "--only", "weka")
    assert r2.returncode in (0, 1), r2.stderr
    text = report.read_text()
    assert text.count(evaluate.BEGIN) == 1 and "small one-touch" not in text
    assert "| small weka | benign | 256 | 2 |" in text


def test_reported_policies_are_replayed_in_every_cell_and_never_judged(tmp_path):
    """[report] policies get a mean per cell (belady with its future: the value of a
    replay made here, not lru's), a paired difference from LRU and a row in the report's
    second table; the verdict reads only the judged policies."""
    text = (PAPER_DIR / "protocol.toml").read_text()
    head = text[:text.index("[[tuning]]")]
    head = head.replace(head[head.index("policies = [\"fifo\""):].split("\n", 1)[0],
                        'policies = ["arc", "belady"]')
    params = ", ".join(f"{k} = {v}" for k, v in SMALL.items())
    p = tmp_path / "p.toml"
    p.write_text(head + '[[tuning]]\nname = "t"\nkind = "attack"\nworkload = "one-touch"\n'
                 f'params = {{ {params} }}\nseeds = [0, 2]\ncapacities = [256]\n'
                 '[[heldout]]\nname = "h"\nkind = "attack"\nworkload = "one-touch"\n'
                 f'params = {{ {params} }}\nseeds = [100, 2]\ncapacities = [256]\n')
    out = tmp_path / "out"
    r = _run("--protocol", str(p), "--out", str(out), "--workers", "1")
    assert r.returncode in (0, 1), r.stderr
    res = json.loads((out / "results.json").read_text())
    (cell,) = res["cells"]
    assert res["reported"] == ["arc", "belady"]
    assert set(cell["paired"]) == {"lru", "s3fifo", "prefixshield"}
    assert set(cell["reported_minus_lru"]) == {"arc", "belady"}
    trace = tmp_path / "ot-100.jsonl"
    write_trace(trace, generate("one-touch", {**SMALL, "seed": 100, "rates": "step"},
                                cost=CostModel()))
    for name in ("arc", "belady"):
        assert cell["values"][name][0] == round(_hit(trace, name, {}, 256, "victim"), 6)
    assert cell["values"]["belady"] != cell["values"]["lru"]
    md = (out / "results.md").read_text()
    assert "### Every policy on the held-out set, reported and not judged" in md
    row = next(x for x in md.splitlines() if x.startswith("| h | 256 |"))
    means = {k: v for k, v in cell["means_pct"].items() if k != "belady"}
    best = max(means.values())
    assert row.endswith(f" | {best - cell['means_pct']['belady']:+.2f} |")


@pytest.mark.parametrize("names,needle", [
    ('["no-such"]', "report.policies: unknown policy 'no-such'"),
    ('["lru"]', "report.policies: 'lru' is already replayed"),
    ('["arc", "arc"]', "report.policies: 'arc' is already replayed"),
    ('"arc"', "report.policies: expected a list of policy names"),
])
def test_bad_reported_policies_are_one_line_errors(tmp_path, names, needle):
    text = (PAPER_DIR / "protocol.toml").read_text()
    head = text[:text.index("[[tuning]]")]
    head = head.replace(head[head.index("policies = [\"fifo\""):].split("\n", 1)[0],
                        f"policies = {names}")
    p = tmp_path / "p.toml"
    p.write_text(head + '[[tuning]]\nname = "t"\nkind = "attack"\nworkload = "one-touch"\n'
                 'seeds = [0, 2]\ncapacities = [256]\n[[heldout]]\nname = "h"\n'
                 'kind = "attack"\nworkload = "one-touch"\nseeds = [100, 2]\n'
                 'capacities = [256]\n')
    r = _run("--protocol", str(p))
    assert r.returncode == 2, r.stderr
    assert needle in r.stderr and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr


def test_weka_selection_skips_and_excludes_before_counting(tmp_path):
    for i, size in enumerate([5, 1, 4, 2, 3, 6, 7]):
        (tmp_path / f"trace_{i:04d}.json").write_text("x" * size)
    files = evaluate.weka_sessions(tmp_path, {"skip": 1, "count": 3, "exclude_every": 3})
    # by size: 1,3,4,2,0,5,6; skip the smallest (1); exclude names 0, 3 and 6
    assert [f.name for f in files] == ["trace_0004.json", "trace_0002.json",
                                       "trace_0005.json"]
    with pytest.raises(evaluate.ProtocolError, match="3 sessions selected, 5 expected"):
        evaluate.weka_sessions(tmp_path, {"skip": 4, "count": 5, "exclude_every": 0})


def test_cells_over_an_absent_shared_folder_are_skipped_and_named(tmp_path, monkeypatch):
    monkeypatch.setattr(evaluate, "SHARED", tmp_path / "absent")
    cells = ('[[tuning]]\nname = "t"\nkind = "benign"\nformat = "weka"\n'
             'source = "shared:weka"\nsessions = { count = 2 }\nbundles = 2\n'
             'capacities = [256]\n[[heldout]]\nname = "h"\nkind = "benign"\nformat = "weka"\n'
             'source = "shared:weka"\nsessions = { count = 2 }\nbundles = 2\n'
             'capacities = [256]\n')
    proto = evaluate.load_protocol(_protocol(tmp_path, cells))
    res = evaluate.run_set(proto, "heldout", {}, 1, None)
    assert res["cells"] == [] and res["skipped"] == [
        f"h: shared:weka absent ({tmp_path / 'absent'} not found)"]


def test_a_regenerated_report_keeps_the_heldout_section(tmp_path):
    """reproduce.py rewrites REPORT.md from its cells; the evaluation's marked section,
    which it does not compute, is carried over unchanged."""
    import reproduce
    assert (reproduce.BEGIN, reproduce.END) == (evaluate.BEGIN, evaluate.END)
    report = tmp_path / "REPORT.md"
    assert reproduce.kept_section(report) == ""
    report.write_text("# old\n")
    evaluate.update_report(report, "## held out\n\n| a |\n")
    kept = reproduce.kept_section(report)
    assert kept == f"{evaluate.BEGIN}\n## held out\n\n| a |\n{evaluate.END}\n"
    report.write_text("# new\n\n" + kept)
    assert reproduce.kept_section(report) == kept


def test_an_attack_cell_without_a_victim_is_refused_not_scored_zero(tmp_path):
    """sharegpt has no victim role: judged as an attack cell it has nothing to judge."""
    cells = ('[[tuning]]\nname = "t"\nkind = "benign"\nworkload = "sharegpt"\n'
             'params = { conversations = 8 }\nseeds = [0, 2]\ncapacities = [256]\n'
             '[[heldout]]\nname = "no victim"\nkind = "attack"\nworkload = "sharegpt"\n'
             'params = { conversations = 8 }\nseeds = [100, 2]\ncapacities = [256]\n')
    r = _run("--protocol", str(_protocol(tmp_path, cells)), "--workers", "1")
    assert r.returncode == 2, r.stderr
    assert "cell 'no victim' at 256 blocks: no measured request in its scope in run " \
           "seed 100" in r.stderr and "Traceback" not in r.stderr


def _row(hit, requests=3, rejected=0):
    return {"hit_fraction": hit, "requests": requests, "rejected": rejected}


def test_a_run_whose_every_request_is_rejected_is_left_out_not_scored_zero():
    """A WEKA bundle whose prompts all exceed the pool has no hit fraction under any
    policy: the cell is judged on its other runs and names the one left out."""
    cell, c = {"name": "w"}, {"capacity": 512, "runs": ["a", "b", "c"]}
    rows = {"lru": [_row(0.5), _row(None, 31, 31), _row(0.7)],
            "rule": [_row(0.6), _row(None, 31, 31), _row(0.7)]}
    kept, excluded = evaluate._measurable(cell, c, rows, ["lru", "rule"])
    assert kept == [0, 2]
    assert excluded == ["b: all 31 requests rejected under every policy (larger than the "
                        "pool)"]
    # some requests unrejected yet nothing measured (warm-ups only): not this case
    rows["rule"][1] = _row(None, 31, 30)
    with pytest.raises(evaluate.ProtocolError, match="no measured request in its scope in "
                                                      "run b"):
        evaluate._measurable(cell, c, rows, ["lru", "rule"])
    # fewer than two runs left: no interval, named with what was left out (run_set makes
    # it a protocol error on whole traces, a cell judged for no policy after a time split)
    rows = {"lru": [_row(None, 2, 2), _row(None, 2, 2), _row(0.7)]}
    with pytest.raises(evaluate.Unmeasurable, match="1 run.s. with measured requests, at "
                                                     "least 2 needed; left out: a: all 2"):
        evaluate._measurable(cell, c, rows, ["lru"])


def test_the_time_split_rule_runs_end_to_end_on_the_rest_of_each_trace(tmp_path):
    """--split: contracts suggested from each trace's first half, every policy replayed on
    the second half; the values equal replays made here through the public API (the
    rule's with the suggested file), and the section goes between its own markers."""
    from psgate import api
    from psgate.suggest import SuggestConfig, rest_lines, split_time_s, suggest

    params = ", ".join(f"{k} = {v}" for k, v in SMALL.items())
    cells = ('[[tuning]]\nname = "t"\nkind = "attack"\nworkload = "one-touch"\n'
             f'params = {{ {params} }}\nseeds = [0, 2]\ncapacities = [256]\n'
             '[[heldout]]\nname = "small one-touch"\nkind = "attack"\n'
             f'workload = "one-touch"\nparams = {{ {params} }}\nseeds = [100, 2]\n'
             'capacities = [256]\n')
    proto = _protocol(tmp_path, cells)
    report = tmp_path / "REPORT.md"
    report.write_text("# A report\n")
    out = tmp_path / "out"
    r = _run("--protocol", str(proto), "--split", "--out", str(out), "--report", str(report),
             "--workers", "1")
    assert r.returncode in (0, 1), r.stderr
    res = json.loads((out / "results.json").read_text())
    assert res["split"]["policy"] == "prefixshield-b" and res["reported"] == []
    (cell,) = res["cells"]
    assert sorted(cell["values"]) == sorted(["lru", "s3fifo", "prefixshield",
                                             evaluate.DEFAULTS, evaluate.RULE])
    settings = res["split"]["suggest"]
    for i, seed in enumerate((100, 101)):
        lines = generate("one-touch", {**SMALL, "seed": seed, "rates": "step"},
                         cost=CostModel())
        full, rest = tmp_path / f"ot-{seed}.jsonl", tmp_path / f"ot-{seed}.rest.jsonl"
        write_trace(full, lines)
        t_s = split_time_s(lines, res["split"]["history"])
        write_trace(rest, rest_lines(lines, t_s))
        assert cell["values"]["lru"][i] == round(_hit(rest, "lru", {}, 256, "victim"), 6)
        contracts = tmp_path / f"c-{seed}.toml"
        contracts.write_text(suggest(SuggestConfig(trace=str(full), capacity=256,
                                                   until_s=t_s, **settings)).text("x"))
        receipt = api.replay(api.ReplayConfig(
            trace=str(rest), baseline="prefixshield-b", candidate="prefixshield-b",
            baseline_params=res["split"]["params"], candidate_params=res["split"]["params"],
            capacity=256, contracts_file=str(contracts), out=tmp_path / f"r-{seed}",
            allow_unexercised=True)).receipt
        got = receipt["runs"]["candidate"]["metrics"]["roles"]["victim"]["hit_fraction"]
        assert cell["values"][evaluate.RULE][i] == round(got, 6)
    low = cell["paired"]["prefixshield"]["ci_pp"][0]
    assert cell["met"] == (low >= -0.1)
    text = report.read_text()
    assert text.count(evaluate.SPLIT_BEGIN) == 1 and evaluate.BEGIN not in text
    assert "| small one-touch | attack | 256 | 2 |" in text


@pytest.mark.parametrize("split, needle", [
    ("history = 1.5\npolicy = \"prefixshield-b\"\n", "split.history"),
    ("history = 0.5\npolicy = \"lru\"\n", "split.policy"),
    ("history = 0.5\npolicy = \"prefixshield\"\nsuggest = { windw_s = 5.0 }\n",
     "split.suggest.windw_s"),
])
def test_bad_split_tables_are_one_line_errors(tmp_path, split, needle):
    text = (PAPER_DIR / "protocol.toml").read_text()
    a = text.index("\n[split]\n") + 1
    b = text.index("\n[", a + 1)
    p = tmp_path / "p.toml"
    p.write_text(text[:a] + "[split]\n" + split + text[b:])
    r = _run("--protocol", str(p), "--split", "--set", "tuning", "--only", "nothing")
    assert r.returncode == 2 and needle in r.stderr and "Traceback" not in r.stderr


def test_the_heldout_split_refuses_overrides():
    r = _run("--split", "--suggest", '{"headroom": 2.0}')
    assert r.returncode == 2 and "registered split rule only" in r.stderr
