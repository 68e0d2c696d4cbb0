"""What people read: tables that fit 80 columns, failing checks on stderr even with --quiet,
stdout carrying JSON only, trace-controlled names printed literally, the HTML report of
one replay and of matched runs."""

from __future__ import annotations

import io
import json
import re
import subprocess
from pathlib import Path

import pytest
from rich.console import Console

from helpers import write_lines
from test_cli import psgate

BAD = "[/bad]"
LINK = "[link=http://x]y[/link]"
LONG = "tenant-with-a-very-long-name-that-a-capture-pseudonymized-0123456789abcdef"
ENV = {"COLUMNS": "80", "NO_COLOR": "1", "TERM": "dumb"}


def hostile_trace(tmp_path: Path, name: str = "hostile.jsonl") -> Path:
    """Three groups whose names rich would read as markup (or would not fit), competing
    for a small cache so that every group evicts and loses blocks."""
    groups = [BAD, LINK, LONG]
    lines = [{"psgate_trace": 1, "block_size": 4}]
    for i in range(60):
        g = groups[i % 3]
        k = i % 3
        lines.append({"t": round(i * 0.01, 3), "op": "request", "id": f"r{i}", "group": g,
                      "contract": "standard", "scope": "m",
                      "blocks": [f"{k}a{i % 4:x}", f"{k}b{i % 4:x}", f"{i:x}c{k}"],
                      "tail": 1, "out": 2,
                      "role": "victim" if g != LINK else "attacker"})
    return write_lines(tmp_path, lines, name)


def _replay(tmp_path, trace, out, *extra):
    return psgate("replay", "--trace", trace, "--capacity", 8, "--baseline", "lru",
                  "--candidate", "prefixshield", "--out", tmp_path / out, *extra, env=ENV)


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    d = tmp_path_factory.mktemp("hostile")
    t = hostile_trace(d)
    proc = _replay(d, t, "r")
    return d, t, proc


# -- the single-run table --------------------------------------------------------------

def test_replay_table_fits_80_columns_with_a_difference_column(hostile):
    _, _, proc = hostile
    assert proc.returncode == 0, proc.stderr
    # the table; a warning is one line whatever its length, for grep
    lines = [ln for ln in proc.stderr.splitlines() if not ln.startswith("psgate: warning:")]
    assert max(len(ln) for ln in lines) <= 80, "\n".join(ln for ln in lines if len(ln) > 80)
    assert any("cand - base" in ln for ln in lines), proc.stderr
    # one metric per row: the label, baseline, candidate and a signed difference
    row = re.compile(r"^\s+hit fraction\s+\d\.\d{4}\s+\d\.\d{4}\s+[+-]\d\.\d{4}\s*$")
    assert sum(bool(row.match(ln)) for ln in lines) >= 4, proc.stderr


def test_render_replay_table_in_an_80_column_console(hostile):
    from psgate.report.render import render_replay

    d, _, _ = hostile
    receipt = json.loads((d / "r" / "receipt.json").read_text())
    for verbose in (False, True):
        buf = io.StringIO()
        render_replay(Console(file=buf, width=80, color_system=None), receipt, d / "r",
                      verbose=verbose)
        text = buf.getvalue()
        assert max(len(ln) for ln in text.splitlines()) <= 80, text
        assert "cand - base" in text and f"group {BAD}" in text
    assert "token hit ratio" in text and "token hit ratio" not in \
        _rendered(receipt, d, verbose=False)


def _rendered(receipt, d, verbose):
    from psgate.report.render import render_replay

    buf = io.StringIO()
    render_replay(Console(file=buf, width=80, color_system=None), receipt, d / "r",
                  verbose=verbose)
    return buf.getvalue()


def test_experiment_table_fits_80_columns(tmp_path):
    proc = psgate("replay", "--workload", "one-touch:attack_requests=20", "--runs", 2,
                  "--resamples", 200, "--baseline", "lru", "--candidate", "prefixshield",
                  "--out", tmp_path / "e", env=ENV)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    assert max(len(ln) for ln in lines) <= 80, proc.stderr
    assert any("95% CI" in ln for ln in lines)
    row = re.compile(r"^\s+hit fraction\s+\S+\s+\S+\s+[+-]\S+\s+\[[+-]\S+, [+-]\S+\]\s*$")
    assert any(row.match(ln) for ln in lines), proc.stderr


# -- failing checks reach stderr, stdout carries JSON ----------------------------------

def test_quiet_still_prints_the_failing_checks(tmp_path):
    t = hostile_trace(tmp_path)
    proc = psgate("replay", "--trace", t, "--capacity", 10000, "--baseline", "lru",
                  "--candidate", "lru", "--out", tmp_path / "o", "--quiet", env=ENV)
    assert proc.returncode == 1
    assert json.loads(proc.stdout)["gate"] == "fail"
    assert "FAIL baseline exercised eviction" in proc.stderr, proc.stderr
    assert "cand - base" not in proc.stderr          # quiet: no table


def test_bench_table_goes_to_stderr(monkeypatch, capsys):
    from psgate import bench as bench_lib
    from psgate import cli

    monkeypatch.setattr(bench_lib, "run", lambda cfg, progress: {"psgate_bench": 1})
    monkeypatch.setattr(bench_lib, "render", lambda result: "THE BENCH TABLE\n")
    cli.bench(quick=True, json=False, repeats=None, vllm_python=None)
    out, err = capsys.readouterr()
    assert out == "" and "THE BENCH TABLE" in err
    cli.bench(quick=True, json=True, repeats=None, vllm_python=None)
    out, err = capsys.readouterr()
    assert json.loads(out) == {"psgate_bench": 1} and "THE BENCH TABLE" not in err


@pytest.mark.parametrize("args", [["policies"], ["trace", "kinds"]])
def test_listing_tables_go_to_stderr(args):
    proc = psgate(*args, env=ENV)
    assert proc.returncode == 0 and proc.stdout == "" and proc.stderr.strip()
    proc = psgate(*args, "--json", env=ENV)
    assert json.loads(proc.stdout)


def test_diff_prints_a_table_and_the_rows_only_with_json(hostile, tmp_path):
    d, t, _ = hostile
    other = psgate("replay", "--trace", t, "--capacity", 8, "--baseline", "lru",
                   "--candidate", "lru", "--out", tmp_path / "lru", "--quiet")
    assert other.returncode == 0, other.stderr
    proc = psgate("diff", d / "r", tmp_path / "lru", env=ENV)
    assert proc.returncode in (0, 1), proc.stderr
    out = json.loads(proc.stdout)
    assert "rows" not in out and "regressed" in out and len(proc.stdout) < 4000
    table = proc.stderr.split("\nconfig:")[0]
    assert "B - A" in table and max(len(ln) for ln in table.splitlines()) <= 80, proc.stderr
    assert f"group:{BAD}" in proc.stderr and f"group:{LINK}" in proc.stderr
    assert proc.stderr.index("B - A") < proc.stderr.index("config:")
    full = json.loads(psgate("diff", d / "r", tmp_path / "lru", "--json").stdout)
    assert full["rows"] and full["regressed"] == out["regressed"]


# -- names from the trace are text, never markup ----------------------------------------

def test_replay_prints_markup_in_group_names_literally(hostile):
    _, _, proc = hostile
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["gate"] == "pass"
    assert f"group {BAD}" in proc.stderr and f"group {LINK}" in proc.stderr
    assert "\x1b]8;" not in proc.stderr                 # no terminal hyperlink


def test_trace_stats_prints_markup_in_group_names_literally(hostile):
    _, t, _ = hostile
    proc = psgate("trace", "stats", t, env=ENV)
    assert proc.returncode == 0, proc.stderr
    flat = proc.stderr.replace("\n", " ")
    assert BAD in flat and "[link=http://x]" in flat, proc.stderr


def test_explain_prints_markup_in_group_names_literally(hostile):
    d, _, _ = hostile
    for seq, name in ((1, BAD), (2, LINK)):
        proc = psgate("explain", d / "r", "--decision", seq, env=ENV)
        assert proc.returncode == 0, proc.stderr
        assert f"of group {name} " in proc.stdout + proc.stderr, proc.stdout


def test_gate_check_naming_a_markup_group_fails_readably(hostile, tmp_path):
    _, t, _ = hostile
    gate = tmp_path / "g.toml"
    gate.write_text(f'[[check]]\nmetric = "hit_fraction"\nselect = "group:{BAD}"\nop = ">="\n'
                    f'ref = 2\n')
    proc = _replay(tmp_path, t, "g", "--gate", gate)
    assert proc.returncode == 1, proc.stderr
    assert json.loads(proc.stdout)["gate"] == "fail"
    fail = [ln for ln in proc.stderr.splitlines() if ln.startswith("FAIL")]
    assert fail and BAD in " ".join(fail), proc.stderr
    proc = _replay(tmp_path, t, "q", "--gate", gate, "--quiet")
    assert proc.returncode == 1 and BAD in proc.stderr, proc.stderr
    # the summary a CI job puts on its page names the failing check, escaped
    proc = psgate("summary", tmp_path / "g", "--format", "json")
    doc = json.loads(proc.stdout)
    assert doc["gate"] == "fail" and [c["select"] for c in doc["failing"]] == [f"group:{BAD}"]
    proc = psgate("summary", tmp_path / "g")
    assert proc.returncode == 0 and "### psgate gate: FAIL" in proc.stdout
    assert "**Failing checks**" in proc.stdout and "group:\\[/bad\\]" in proc.stdout


def test_summary_escapes_names_in_markdown(hostile):
    from psgate.report.summary import markdown, md_escape, summarize

    d, _, _ = hostile
    doc = summarize(d / "r")
    assert doc["gate"] == "pass" and doc["kind"] == "replay"
    md = markdown(doc)
    assert md_escape(f"group:{BAD}") in md and "\\[/bad\\]" in md
    assert md_escape("<img src=x>") == "&lt;img src=x&gt;"
    assert "|" not in md_escape("a|b").replace("\\|", "")
    # a tenant named with a terminal escape prints as text, not as a colour change
    shown = md_escape("t\x1b[31mred\x07")
    assert "\x1b" not in shown and "\x07" not in shown and "x1b" in shown


# -- the HTML report ----------------------------------------------------------------------

def test_report_heatmap_shares_one_scale_and_labels_dark_cells_white(hostile):
    from psgate.report import html as rep
    from psgate.report.receipts import load_receipt

    d, _, _ = hostile
    plt = rep._plt()
    receipt = load_receipt(d / "r")
    groups = sorted(receipt["runs"]["candidate"]["metrics"]["groups"])
    fig = rep.evictions_figure(plt, receipt, groups, {"baseline": "lru",
                                                      "candidate": "prefixshield"})
    images = [ax.images[0] for ax in fig.axes if ax.images]
    assert len(images) == 2 and images[0].get_clim() == images[1].get_clim()
    vmax = images[0].get_clim()[1]
    for ax in fig.axes[:2]:
        for txt in ax.texts:
            v = int(txt.get_text())
            colour = txt.get_color()
            assert colour == ("white" if v > 0.55 * vmax else "black"), (v, vmax, colour)
    assert any(t.get_color() == "white" for ax in fig.axes for t in ax.texts)
    plt.close(fig)


def test_report_hit_line_at_zero_is_visible(hostile):
    from psgate.report import html as rep

    d, _, _ = hostile
    plt = rep._plt()
    fig = rep.hits_figure(plt, rep.read_requests(d / "r"), {"baseline": "lru",
                                                             "candidate": "prefixshield"})
    for ax in fig.axes:
        lo, hi = ax.get_ylim()
        assert lo < 0 and hi > 1
        attacker = [ln for ln in ax.lines if ln.get_label() == "attacker"]
        assert attacker and max(attacker[0].get_ydata()) == 0.0
    plt.close(fig)


def test_report_provenance_has_no_python_reprs(hostile, tmp_path):
    d, _, _ = hostile
    proc = psgate("report", d / "r", "-o", tmp_path / "r.html")
    assert proc.returncode == 0, proc.stderr
    page = (tmp_path / "r.html").read_text()
    assert "{'" not in page and "&#x27;" not in page.split("<h2>Provenance</h2>")[1]
    assert "prefixshield: contracts=" in page and "leaf_only=true" in page


@pytest.fixture(scope="module")
def experiment_report(tmp_path_factory):
    d = tmp_path_factory.mktemp("exp")
    proc = psgate("replay", "--workload", "one-touch:attack_requests=20", "--runs", 3,
                  "--resamples", 200, "--baseline", "lru", "--candidate", "prefixshield",
                  "--out", d / "e", "--quiet")
    assert proc.returncode == 0, proc.stderr
    proc = psgate("report", d / "e", "-o", d / "e.html")
    assert proc.returncode == 0, proc.stderr
    return d / "e.html"


def test_summary_of_matched_runs(experiment_report):
    proc = psgate("summary", experiment_report.parent / "e", "--format", "json")
    doc = json.loads(proc.stdout)
    assert doc["kind"] == "experiment" and doc["runs"] == 3 and doc["gate"] == "pass"
    row = next(r for r in doc["metrics"] if r["scope"] == "all" and r["metric"] == "hit_fraction")
    assert row["ci_low"] <= row["difference"] <= row["ci_high"]
    md = psgate("summary", experiment_report.parent / "e").stdout
    assert "| scope | metric | baseline | candidate | difference | 95% interval |" in md


def test_report_of_matched_runs(experiment_report):
    page = experiment_report.read_text()
    for pid in ("plot-paired-hits", "plot-paired-ttft", "plot-runs"):
        assert f'id="{pid}"' in page
    assert "Paired differences" in page and "95% CI low" in page
    for run in ("run-000", "run-001", "run-002"):
        assert run in page
    assert "matched run(s) of workload one-touch attack_requests=20" in page
    assert not re.search(r'<(script|link|img|iframe)[^>]+(src|href)=', page)


def test_report_of_matched_runs_renders_in_chromium(experiment_report, tmp_path):
    from test_html import CHROMIUM

    if CHROMIUM is None:
        pytest.skip("chromium not installed here (CI installs it)")
    proc = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=5000",
         "--window-size=1280,2000", "--dump-dom", experiment_report.as_uri()],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    m = re.search(r'<pre id="psgate-selfcheck">([^<]*)</pre>', proc.stdout)
    check = json.loads(m.group(1).replace("&quot;", '"'))
    assert check["errors"] == []
    assert [p["id"] for p in check["plots"]] == ["plot-paired-hits", "plot-paired-ttft",
                                                 "plot-runs"]
    assert all(p["width"] > 100 and p["height"] > 100 for p in check["plots"])


def _receipt(base: dict, cand: dict) -> dict:
    return {"runs": {"baseline": {"metrics": {"groups": {
        g: {"hit_fraction": v} for g, v in base.items()}}},
        "candidate": {"metrics": {"groups": {g: {"hit_fraction": v} for g, v in cand.items()}}}}}


def test_the_verdict_line_names_the_group_hurt_most_or_else_the_one_that_gained_most():
    from psgate.report.render import group_verdict
    hurt = _receipt({"a": 0.5, "b": 0.7, "c": 0.2}, {"a": 0.45, "b": 0.5, "c": 0.9})
    assert group_verdict(hurt) == "hurt most: b, hit fraction 0.7000 -> 0.5000 (-0.2000)"
    gained = _receipt({"a": 0.5, "b": 0.25, "c": None}, {"a": 0.6, "b": 0.75, "c": 0.1})
    assert group_verdict(gained) == ("no group's hit fraction fell; gained most: b, 0.2500 "
                                     "-> 0.7500 (+0.5000)")
    tie = _receipt({"b": 0.5, "a": 0.25}, {"b": 0.75, "a": 0.5})     # both +0.25 exactly
    assert "gained most: a, " in group_verdict(tie)
    assert group_verdict(_receipt({}, {})) is None
    summary = {"summary": {"groups": {"x": {"hit_fraction": {"baseline_mean": 0.4,
                                                              "candidate_mean": 0.3}}}}}
    assert group_verdict(summary) == "hurt most: x, hit fraction 0.4000 -> 0.3000 (-0.1000)"

