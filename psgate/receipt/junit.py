"""Gate checks as JUnit XML, so any CI system shows the gate natively."""

from __future__ import annotations

import os
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path


def junit_xml(suite: str, checks: list[dict]) -> bytes:
    """One testcase per check; ``verdict`` pass, fail or skip (a skipped case, with its
    reason in ``note``)."""
    failures = sum(c["verdict"] == "fail" for c in checks)
    skipped = sum(c["verdict"] == "skip" for c in checks)
    root = ET.Element("testsuites", name="psgate", tests=str(len(checks)),
                      failures=str(failures))
    ts = ET.SubElement(root, "testsuite", name=suite, tests=str(len(checks)),
                       failures=str(failures), errors="0", skipped=str(skipped))
    for c in checks:
        tc = ET.SubElement(ts, "testcase", classname=f"psgate.{suite}", name=c["name"])
        detail = (f"observed {c.get('observed')!r}, required {c.get('op', '')} "
                  f"{c.get('threshold')!r}" + (f" ({c['note']})" if c.get("note") else ""))
        if c["verdict"] == "fail":
            f = ET.SubElement(tc, "failure", message=detail, type="GateCheckFailed")
            f.text = detail
        elif c["verdict"] == "skip":
            ET.SubElement(tc, "skipped", message=c.get("note") or "skipped")
        else:
            ET.SubElement(tc, "system-out").text = detail
    return ET.tostring(root, encoding="utf-8", xml_declaration=True) + b"\n"


def write_junit(path: str | Path, suite: str, checks: list[dict]) -> None:
    """Atomically: a temporary file beside the target, then a rename."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent or ".")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(junit_xml(suite, checks))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
