"""The docs site: its generated reference pages are current, and it builds with
``mkdocs build --strict`` (every page in the navigation, every link and anchor resolved),
offline."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_the_generated_reference_pages_are_current():
    proc = subprocess.run([sys.executable, "tools/reference_docs.py", "--check"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_the_site_builds_strict(tmp_path):
    if importlib.util.find_spec("mkdocs") is None or \
            importlib.util.find_spec("material") is None:
        if os.environ.get("CI"):
            raise AssertionError("mkdocs-material is in the test extra but not installed")
        pytest.skip("mkdocs-material not installed (pip install '.[docs]')")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                           str(tmp_path / "site")], cwd=ROOT, capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "site" / "tutorial" / "index.html").exists()
    assert (tmp_path / "site" / "reference" / "cli" / "index.html").exists()


def test_the_readme_stays_short_and_the_code_cites_the_design_page():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 200
    design = (ROOT / "docs" / "design.md").read_text()
    cited = []
    for p in [*ROOT.glob("psgate/**/*.py"), *ROOT.glob("tests/**/*.py")]:
        text = p.read_text()
        # the design brief's old names, spelled so that this file does not match itself
        assert "DESIGN" + ".md" not in text and "DESIGN" + " section" not in text, p
        cited += [int(n) for n in re.findall(r"docs/design\.md section (\d)", text)]
    assert cited, "no code cites docs/design.md"
    for n in set(cited):
        assert f"\n## {n}. " in design, n


def test_the_tutorials_pictures_are_drawn_from_a_replay(tmp_path):
    """tools/docs_figures.py draws every picture the tutorial shows (from a replay of the
    bundled incident, with the HTML report's figures)."""
    pytest.importorskip("matplotlib")
    proc = subprocess.run([sys.executable, "tools/docs_figures.py", "--out", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    shown = re.findall(r"\]\(img/([\w.-]+\.png)\)", (ROOT / "docs" / "tutorial.md").read_text())
    assert len(shown) == 3
    for name in shown:
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
        assert (ROOT / "docs" / "img" / name).exists(), name

