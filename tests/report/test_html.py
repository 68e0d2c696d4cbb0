"""psgate report: a self-contained HTML file whose plots render in headless Chromium."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import pytest

from psgate.trace.writer import write_trace
from psgate.workloads.paper import one_touch

from test_cli import assert_one_line_error, psgate

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
PLOTS = ["plot-occupancy", "plot-lost", "plot-debt", "plot-hits", "plot-ttft",
         "plot-evictions", "plot-recompute"]


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    d = tmp_path_factory.mktemp("rep")
    assert psgate("replay", "--baseline", "lru", "--candidate", "prefixshield", "--out", d / "r",
                  "--quiet").returncode == 0
    proc = psgate("report", d / "r", "-o", d / "report.html")
    assert proc.returncode == 0, proc.stderr
    return d / "report.html"


def test_report_is_self_contained(report):
    page = report.read_text()
    for pid in PLOTS:
        assert f'id="{pid}"' in page
    assert page.count("<svg") >= len(PLOTS)
    # nothing fetched: no external scripts, styles, images or fonts
    assert not re.search(r'<(script|link|img|iframe)[^>]+(src|href)=', page)
    assert "@import" not in page and "url(http" not in page
    assert "bundled:example" in page and "PASS" in page


@pytest.mark.parametrize("size", ["1366,768", "390,844"], ids=["laptop", "phone"])
def test_report_renders_in_headless_chromium(report, tmp_path, size):
    if CHROMIUM is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is missing in CI: .ci/run installs Debian's chromium")
        pytest.skip("chromium not installed here (CI installs it)")
    proc = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
         "--no-first-run", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", f"--user-data-dir={tmp_path / 'profile'}", "--enable-logging=stderr",
         "--virtual-time-budget=5000", f"--window-size={size}", "--dump-dom",
         report.as_uri()], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    m = re.search(r'<pre id="psgate-selfcheck">([^<]*)</pre>', proc.stdout)
    assert m, "the page's self-check did not run"
    check = json.loads(m.group(1).replace("&quot;", '"'))
    assert check["errors"] == []
    assert [p["id"] for p in check["plots"]] == PLOTS
    for p in check["plots"]:        # drawn, and scaled to the screen: none wider than it
        assert p["width"] > 100 and p["height"] > 100, p
        assert p["width"] <= check["viewport"], (p, check["viewport"])
    # a wide table scrolls inside itself: the page never scrolls sideways
    assert check["page"] <= check["viewport"], check
    # a screenshot of the first screen, kept with the test's files for a reader to look at
    shot = tmp_path / f"report-{size.replace(',', 'x')}.png"
    subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
                    f"--user-data-dir={tmp_path / 'profile2'}", f"--window-size={size}",
                    f"--screenshot={shot}", report.as_uri()], capture_output=True, timeout=120)
    assert shot.exists() and shot.stat().st_size > 1000
    assert "Uncaught" not in proc.stderr and ":CONSOLE(" not in proc.stderr


def test_report_without_the_trace_still_renders(tmp_path):
    t = tmp_path / "ot.jsonl"
    write_trace(t, one_touch(attack_requests=20, warmup_s=1.0, cooldown_s=0.5))
    assert psgate("replay", "--baseline", "lru", "--candidate", "lru",
                  "--trace", t, "--out", tmp_path / "r", "--quiet").returncode == 0
    t.unlink()
    proc = psgate("report", tmp_path / "r", "-o", tmp_path / "x.html")
    assert proc.returncode == 0, proc.stderr
    page = (tmp_path / "x.html").read_text()
    assert "Time series need the trace" in page and 'id="plot-ttft"' in page


def test_report_without_matplotlib_exits_3(report, tmp_path):
    fake = tmp_path / "fake" / "matplotlib"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('blocked for this test')\n")
    env = {"PYTHONPATH": str(tmp_path / "fake") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = psgate("report", report.parent / "r", "-o", tmp_path / "y.html", env=env)
    assert_one_line_error(proc, 3, "matplotlib", "psgate[report]")
    assert not (tmp_path / "y.html").exists()


def test_report_of_a_non_receipt_exits_2(tmp_path):
    proc = psgate("report", tmp_path, "-o", tmp_path / "z.html")
    assert_one_line_error(proc, 2, "no receipt.json here")
    assert not (tmp_path / "z.html").exists()


def test_the_eviction_timeline_shades_the_attack_window_the_trace_records(report):
    """The bundled example is generated with an attack window; the page says so, and a
    trace without one (a capture, an import) gets no shading."""
    from psgate.report.html import incident_window
    page = report.read_text()
    assert "Blocks each group lost to eviction over time (shaded: the attack window the " \
           "trace records)" in page
    assert incident_window({"generator": {"params": {"attack_start_s": 3,
                                                     "attack_end_s": 9}}}) == (3.0, 9.0)
    assert incident_window({"source": "psgate capture"}) is None
    assert incident_window({"generator": {"params": {"attack_start_s": 9,
                                                     "attack_end_s": 3}}}) is None

