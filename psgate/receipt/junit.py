"""Gate checks as JUnit XML, so any CI system shows the gate natively."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from psgate.atomic import write_atomic


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
    """As every other output is written: whole or not at all, with the umask's mode, and
    a failure naming the file."""
    write_atomic(path, junit_xml(suite, checks))
