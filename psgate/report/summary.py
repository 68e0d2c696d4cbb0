"""psgate summary: a receipt's verdict in a few lines, as JSON or as Markdown.

Made for a CI job's step summary (``$GITHUB_STEP_SUMMARY``) and a pull-request comment:
the gate, the headline metrics of baseline and candidate with their difference (with the
bootstrap interval for matched runs), and every failing check. The Markdown is built from
the same JSON, so the two never disagree. Names from a trace (groups, roles) and from a
gate file (check names) reach a page that renders Markdown and inline HTML, so every cell
is escaped: a tenant named ``<img src=...>`` or ``|x|`` stays text.
"""

from __future__ import annotations

import re
from pathlib import Path

from psgate.report.receipts import load_receipt
from psgate.report.render import (DEFAULT_GROUPS, HEADLINE, LABELS, delta, fmt, fmt_diff,
                                  printable, times_label)

SUMMARY_FORMAT = 1
_MD_SPECIAL = re.compile(r"([\\`*_\[\]|~])")


def _scopes(metrics: dict) -> tuple[list[tuple[str, str, dict]], int]:
    out = [("all", "all", metrics["totals"])]
    out += [("role", f"role:{r}", v) for r, v in sorted(metrics.get("roles", {}).items())]
    groups = sorted(metrics.get("groups", {}).items())
    out += [("group", f"group:{g}", v) for g, v in groups[:DEFAULT_GROUPS]]
    return out, max(0, len(groups) - DEFAULT_GROUPS)


def _failing(gate: dict) -> list[dict]:
    return [{k: c.get(k) for k in ("name", "metric", "select", "observed", "op", "threshold",
                                   "note") if k in c}
            for c in gate.get("checks", []) if c.get("verdict") == "fail"]


def summarize(directory: str | Path) -> dict:
    """The summary of a replay's or a matched-run experiment's receipt directory."""
    d = Path(directory)
    receipt = load_receipt(d, experiment_ok=True)
    gate = receipt["gate"]
    cfg = receipt["config"]
    out = {"psgate_summary": SUMMARY_FORMAT, "receipt": str(d / "receipt.json"),
           "gate": gate["result"], "checks": gate["num_checks"],
           "failed_checks": gate["num_failed"],
           "baseline": cfg["baseline"]["name"], "candidate": cfg["candidate"]["name"],
           "usable_blocks": cfg["usable_blocks"], "times": times_label(receipt)}
    rows = []
    if "psgate_experiment" in receipt:
        s = receipt["summary"]
        out.update(kind="experiment", runs=s["num_runs"],
                   source=receipt.get("source", {}).get("kind", "workload"),
                   interval_level=cfg.get("bootstrap", {}).get("level", 0.95))
        scopes, hidden = _scopes(s)
        for kind, label, scope in scopes:
            for m in HEADLINE[kind]:
                if m in scope:
                    e = scope[m]
                    rows.append({"scope": label, "metric": m, "baseline": e.get("baseline_mean"),
                                 "candidate": e.get("candidate_mean"),
                                 "difference": e.get("diff_mean"),
                                 "ci_low": e.get("diff_ci_low"),
                                 "ci_high": e.get("diff_ci_high")})
    else:
        base = receipt["runs"]["baseline"]["metrics"]
        cand = receipt["runs"]["candidate"]["metrics"]
        out.update(kind="replay", trace=receipt["trace"]["path"],
                   trace_canonical_sha256=receipt["trace"]["canonical_sha256"])
        merged = {"totals": cand["totals"],
                  "roles": {**base.get("roles", {}), **cand.get("roles", {})},
                  "groups": {**base.get("groups", {}), **cand.get("groups", {})}}
        scopes, hidden = _scopes(merged)
        for kind, label, _ in scopes:
            if kind == "all":
                a, b = base["totals"], cand["totals"]
            else:
                key, name = ("roles" if kind == "role" else "groups"), label.split(":", 1)[1]
                a, b = base.get(key, {}).get(name, {}), cand.get(key, {}).get(name, {})
            for m in HEADLINE[kind]:
                if m in a or m in b:
                    rows.append({"scope": label, "metric": m, "baseline": a.get(m),
                                 "candidate": b.get(m), "difference": delta(a.get(m), b.get(m))})
    out["metrics"] = rows
    out["groups_not_shown"] = hidden
    out["failing"] = _failing(gate)
    return out


def md_escape(text) -> str:
    """Text that GitHub's Markdown shows as written: no HTML, link, emphasis or cell break."""
    s = str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    s = printable(s.replace("\r", " ").replace("\n", " "))   # a terminal escape stays text
    return _MD_SPECIAL.sub(r"\\\1", s)


def _code(text) -> str:
    return f"`{str(text).replace('`', '')}`" if text is not None else "-"


def markdown(summary: dict) -> str:
    """The summary as a Markdown section (ends with a newline, to be appended to a file)."""
    ok = summary["gate"] == "pass"
    lines = [f"### psgate gate: {'PASS' if ok else 'FAIL'} {':white_check_mark:' if ok else ':x:'}",
             ""]
    what = (f"{md_escape(summary['baseline'])} (baseline) vs "
            f"{md_escape(summary['candidate'])} (candidate)")
    if summary["kind"] == "experiment":
        over = ("trace(s) of a corpus" if summary.get("source") == "corpus"
                else "matched run(s)")
        lines.append(f"{what} over {summary['runs']} {over}, "
                     f"{summary['usable_blocks']} usable blocks; "
                     f"{summary['checks'] - summary['failed_checks']}/{summary['checks']} "
                     f"checks passed. Means over runs; difference = candidate - baseline with "
                     f"its {summary['interval_level']:.0%} paired bootstrap interval; "
                     f"times {summary.get('times', 'modeled')}.")
    else:
        lines.append(f"{what} on {md_escape(summary['trace'])} "
                     f"({summary['usable_blocks']} usable blocks); "
                     f"{summary['checks'] - summary['failed_checks']}/{summary['checks']} "
                     f"checks passed. Difference = candidate - baseline; "
                     f"times {summary.get('times', 'modeled')}.")
    lines.append("")
    exp = summary["kind"] == "experiment"
    head = "| scope | metric | baseline | candidate | difference |"
    rule = "|---|---|---:|---:|---:|"
    if exp:
        head += f" {summary['interval_level']:.0%} interval |"
        rule += "---:|"
    lines += [head, rule]
    for r in summary["metrics"]:
        like = (r["baseline"], r["candidate"])
        row = (f"| {md_escape(r['scope'])} | {md_escape(LABELS.get(r['metric'], r['metric']))}"
               f" | {fmt(r['baseline'])} | {fmt(r['candidate'])} | "
               f"{fmt_diff(r['difference'], *like)} |")
        if exp:
            ci = ("-" if r.get("ci_low") is None else
                  f"[{fmt_diff(r['ci_low'], *like)}, {fmt_diff(r['ci_high'], *like)}]")
            row += f" {ci} |"
        lines.append(row)
    if summary["groups_not_shown"]:
        lines += ["", f"{summary['groups_not_shown']} more groups in the receipt."]
    lines.append("")
    if summary["failing"]:
        lines += ["**Failing checks**", "", "| check | observed | required |", "|---|---:|---|"]
        for c in summary["failing"]:
            note = f" ({c['note']})" if c.get("note") else ""
            lines.append(f"| {md_escape(str(c.get('name')) + note)} | "
                         f"{md_escape(fmt(c.get('observed')))} | "
                         f"{md_escape(c.get('op'))} {md_escape(fmt(c.get('threshold')))} |")
    else:
        lines.append("No check failed.")
    lines += ["", f"Receipt: {_code(summary['receipt'])}", ""]
    return "\n".join(lines)
