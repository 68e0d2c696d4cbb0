"""docs/policy-api.md is what tools/policy_api_doc.py generates from psgate.policy now."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import psgate.policy as api

ROOT = Path(__file__).resolve().parents[2]


def test_the_reference_page_is_current():
    proc = subprocess.run([sys.executable, "tools/policy_api_doc.py", "--check"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_the_page_names_every_exported_name():
    page = (ROOT / "docs" / "policy-api.md").read_text()
    for name in api.__all__:
        assert f"`{name}" in page, name
    assert f"Policy API version: **{api.API_VERSION}**" in page
