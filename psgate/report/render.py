"""What people read on stderr: the tables and verdict lines of replay, diff, trace stats.

Every string that comes from a trace, a receipt or a gate file (group and role names,
paths, check names) is put in a ``rich.text.Text`` or printed with ``markup=False``:
rich would otherwise read ``[/x]`` in a tenant's name as markup, and either fail after
the receipt is written or turn ``[link=...]`` into a terminal hyperlink. Tables are laid
out one metric per row so that they fit an 80-column terminal without wrapping a number.
"""

from __future__ import annotations

from pathlib import Path

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

# (metric key, label) in the order a reader wants them
LABELS = {
    "hit_fraction": "hit fraction",
    "token_hit_ratio": "token hit ratio",
    "saved_prefill_tokens": "saved tokens",
    "ttft_p50_ms": "TTFT p50 ms",
    "ttft_p95_ms": "TTFT p95 ms",
    "evictions": "evictions",
    "evictions_suffered": "blocks lost",
    "admission_waits": "admission waits",
    "recompute_tokens": "recomputed tokens",
}
# the default table: a few headline metrics per kind of scope; --verbose shows them all
HEADLINE = {
    "all": ("hit_fraction", "saved_prefill_tokens", "ttft_p95_ms", "evictions"),
    "role": ("hit_fraction", "ttft_p95_ms"),
    "group": ("hit_fraction", "evictions_suffered"),
}
VERBOSE = tuple(LABELS)
# groups listed without --verbose (an imported trace may have hundreds)
DEFAULT_GROUPS = 8


def times_label(receipt: dict) -> str:
    """How a receipt's times were taken: "observed" when the real engine ran on the wall
    clock (``--engine vllm``, wall pacing), else "modeled" (a cost model's, the step
    clock's under lockstep pacing included)."""
    cfg = receipt["config"]
    wall = (cfg.get("engine_info") or {}).get("pacing", "wall") == "wall"
    return "observed" if cfg["engine"] == "vllm" and wall else "modeled"


def printable(text: str) -> str:
    """``text`` with control characters escaped: a newline in a tenant's name would
    otherwise start a new table row that is not one."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(text))


def fmt(x) -> str:
    """A number short enough for a table cell: 4 decimals below 10, 1 above."""
    if x is None:
        return "-"
    if isinstance(x, bool):
        return str(x).lower()
    if isinstance(x, float):
        return f"{x:.4f}" if abs(x) < 10 else f"{x:.1f}"
    return str(x)


def fmt_diff(x, *like) -> str:
    """A signed difference, so that a gain and a loss read differently at a glance, with
    the decimals of the values it is the difference of (``like``): a TTFT of 128.7 ms
    against 120.4 ms differs by -8.3, not -8.3000."""
    if x is None:
        return "-"
    if isinstance(x, float):
        ref = max([abs(v) for v in like if isinstance(v, (int, float))] or [abs(x)])
        return f"{x:+.4f}" if ref < 10 else f"{x:+.1f}"
    return f"{x:+d}"


def delta(a, b):
    """candidate - baseline as a table shows it: counts stay whole (-901, not -901.0),
    rates lose float noise, and a value missing on one side has no difference."""
    if isinstance(a, bool) or isinstance(b, bool):
        return None
    if isinstance(a, int) and isinstance(b, int):
        return b - a
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return round(float(b) - float(a), 9)
    return None


def _table(caption: str | None, columns: list[str]) -> Table:
    """A borderless table; its heading is printed by the caller as a line of its own
    (a table title would be wrapped to the table's width)."""
    t = Table(caption=Text(caption) if caption else None, box=box.SIMPLE_HEAD, pad_edge=False,
              caption_justify="left")
    t.add_column(Text(columns[0]), overflow="fold")
    for col in columns[1:]:
        t.add_column(Text(col), justify="right", no_wrap=True)
    return t


def _scopes(metrics: dict, verbose: bool) -> tuple[list[tuple[str, str, dict]], int]:
    """(kind, label, metrics) for every scope shown, and how many groups were left out."""
    out = [("all", "all", metrics["totals"])]
    out += [("role", f"role {r}", v) for r, v in sorted(metrics.get("roles", {}).items())]
    groups = sorted(metrics.get("groups", {}).items())
    hidden = 0 if verbose else max(0, len(groups) - DEFAULT_GROUPS)
    if hidden:
        groups = groups[:DEFAULT_GROUPS]
    out += [("group", f"group {g}", v) for g, v in groups]
    return out, hidden


def replay_table(receipt: dict, verbose: bool = False) -> Table:
    """One replay: per scope and metric, baseline, candidate and their difference."""
    runs = receipt["runs"]
    base, cand = runs["baseline"]["metrics"], runs["candidate"]["metrics"]
    merged = {"totals": cand["totals"],
              "roles": {**base.get("roles", {}), **cand.get("roles", {})},
              "groups": {**base.get("groups", {}), **cand.get("groups", {})}}
    scopes, hidden = _scopes(merged, verbose)
    caption = (f"{receipt['config']['usable_blocks']} usable blocks; "
               f"times {times_label(receipt)}"
               + (f"; {hidden} more groups with --verbose" if hidden else ""))
    t = _table(caption, ["scope / metric", "baseline", "candidate", "cand - base"])
    for kind, label, _ in scopes:
        if kind == "all":
            a, b = base["totals"], cand["totals"]
        else:
            key = "roles" if kind == "role" else "groups"
            name = label.split(" ", 1)[1]
            a, b = base.get(key, {}).get(name, {}), cand.get(key, {}).get(name, {})
        shown = [m for m in (VERBOSE if verbose else HEADLINE[kind]) if m in a or m in b]
        if not shown:
            continue
        t.add_row(Text(printable(label), style="bold"), "", "", "")
        for m in shown:
            t.add_row(Text(f"  {LABELS[m]}"), fmt(a.get(m)), fmt(b.get(m)),
                      fmt_diff(delta(a.get(m), b.get(m)), a.get(m), b.get(m)))
    return t


def replay_heading(receipt: dict) -> Text:
    runs = receipt["runs"]
    return Text(f"psgate replay of {receipt['trace']['path']}: "
                f"{runs['baseline']['policy']['name']} (baseline) vs "
                f"{runs['candidate']['policy']['name']} (candidate)", style="bold")


def _ci(entry: dict) -> str:
    if entry.get("diff_ci_low") is None:
        return "-"
    like = (entry.get("baseline_mean"), entry.get("candidate_mean"))
    return f"[{fmt_diff(entry['diff_ci_low'], *like)}, {fmt_diff(entry['diff_ci_high'], *like)}]"


def experiment_table(receipt: dict, verbose: bool = False) -> Table:
    """Matched runs: run-level means and the paired difference with its bootstrap interval."""
    s = receipt["summary"]
    cfg = receipt["config"]
    level = cfg.get("bootstrap", {}).get("level", 0.95)
    scopes, hidden = _scopes(s, verbose)
    caption = (f"{cfg['usable_blocks']} usable blocks; means over {s['num_runs']} run(s); "
               f"interval: paired bootstrap over runs; times {times_label(receipt)}"
               + (f"; {hidden} more groups with --verbose" if hidden else ""))
    t = _table(caption, ["scope / metric", "baseline", "candidate", "cand - base",
                         f"{level:.0%} CI"])
    for kind, label, scope in scopes:
        shown = [m for m in (VERBOSE if verbose else HEADLINE[kind]) if m in scope]
        if not shown:
            continue
        t.add_row(Text(printable(label), style="bold"), "", "", "", "")
        for m in shown:
            e = scope[m]
            t.add_row(Text(f"  {LABELS[m]}"), fmt(e.get("baseline_mean")),
                      fmt(e.get("candidate_mean")),
                      fmt_diff(e.get("diff_mean"), e.get("baseline_mean"),
                               e.get("candidate_mean")), _ci(e))
    return t


def experiment_heading(receipt: dict) -> Text:
    cfg = receipt["config"]
    return Text(f"psgate: {cfg['baseline']['name']} (baseline) vs {cfg['candidate']['name']} "
                f"(candidate) over {receipt['summary']['num_runs']} run(s)", style="bold")


def check_line(c: dict) -> Text:
    """One gate check as a line: verdict, name, observed value against the requirement."""
    verdict = c.get("verdict", "?")
    style = "red" if verdict == "fail" else "green"
    rest = (f" {c.get('name', '?')}: observed {fmt(c.get('observed'))}, required "
            f"{c.get('op', '?')} {fmt(c.get('threshold'))}"
            + (f" ({c['note']})" if c.get("note") else ""))
    return Text.assemble((verdict.upper(), style), printable(rest))


def render_failures(console: Console, gate: dict) -> None:
    """The failing checks: printed whatever --quiet says, because a CI log must say why."""
    for c in gate.get("checks", []):
        if c.get("verdict") == "fail":
            console.print(check_line(c))


def group_verdict(receipt: dict) -> str | None:
    """The group a reader asks about first, in words: the one whose hit fraction fell most
    under the candidate, or, when none fell, the one that gained most (ties by name);
    None without groups. Means over runs for matched runs."""
    if "summary" in receipt:
        groups = {g: (v["hit_fraction"].get("baseline_mean"),
                      v["hit_fraction"].get("candidate_mean"))
                  for g, v in receipt["summary"].get("groups", {}).items()
                  if "hit_fraction" in v}
    else:
        runs = receipt["runs"]
        base = runs["baseline"]["metrics"]["groups"]
        cand = runs["candidate"]["metrics"]["groups"]
        groups = {g: (base[g].get("hit_fraction"), cand.get(g, {}).get("hit_fraction"))
                  for g in base}
    moved = sorted((c - b, g, b, c) for g, (b, c) in groups.items()
                   if b is not None and c is not None)
    if not moved:
        return None
    d, g, b, c = moved[0]
    if d < 0:
        return f"hurt most: {g}, hit fraction {fmt(b)} -> {fmt(c)} ({fmt_diff(d, b, c)})"
    d, g, b, c = min(moved, key=lambda m: (-m[0], m[1]))
    return (f"no group's hit fraction fell; gained most: {g}, {fmt(b)} -> {fmt(c)} "
            f"({fmt_diff(d, b, c)})")


def render_gate(console: Console, gate: dict, where: str, verbose: bool = False,
                groups: str | None = None) -> None:
    if verbose:
        for c in gate.get("checks", []):
            if c.get("verdict") != "fail":
                console.print(check_line(c))
    render_failures(console, gate)
    colour = "green" if gate["result"] == "pass" else "red"
    console.print(Text.assemble(
        "gate: ", (gate["result"].upper(), colour),
        f" ({gate['num_checks'] - gate['num_failed']}/{gate['num_checks']} checks passed); "
        + (printable(groups) + "; " if groups else "") + where))


def render_replay(console: Console, receipt: dict, out: Path, verbose: bool = False) -> None:
    console.print(replay_heading(receipt))
    console.print(replay_table(receipt, verbose))
    render_gate(console, receipt["gate"], f"receipt in {out}/", verbose, group_verdict(receipt))


def render_experiment(console: Console, receipt: dict, out: Path,
                      verbose: bool = False) -> None:
    console.print(experiment_heading(receipt))
    console.print(experiment_table(receipt, verbose))
    render_gate(console, receipt["gate"],
                f"receipt in {out}/ (one receipt per run in {out}/runs/)", verbose,
                group_verdict(receipt))


def render_trace_stats(console: Console, trace: str, st: dict) -> None:
    console.print(Text(f"{trace}: {st['requests']} requests, {st['groups']} groups, "
                       f"{st['scopes']} scopes, block size {st['block_size']}", style="bold"))
    t = _table(None, ["measure", "value"])
    for k in ("block_references", "unique_blocks", "span_s", "infinite_cache_hit_ratio"):
        t.add_row(Text(k.replace("_", " ")), fmt(st[k]))
    if st.get("answer_blocks"):         # blocks a request's answer names, cached as it decodes
        t.add_row(Text("answer blocks"), fmt(st["answer_blocks"]))
    for r in st["reuse_distance_profile"]:
        t.add_row(Text(f"reuse distance [{r['distance_ge']}, {r['distance_lt']})"),
                  str(r["references"]))
    for g, v in st["per_group"].items():
        t.add_row(Text(printable(f"group {g} ({v['contract']}): created blocks/s vs refill")),
                  f"{v['creation_rate_blocks_per_s']} / {fmt(v['refill_blocks_per_s'])} "
                  f"= {fmt(v['creation_pressure_ratio'])}")
    console.print(t)


def render_contracts_suggestion(console: Console, trace: str, doc: dict) -> None:
    """psgate contracts suggest's table: per group what the history showed, what it would
    need, what the file gives it (after the caps) and how much of the history it would
    have owed under that."""
    lo, hi = doc["history_s"]
    console.print(Text(f"{trace}: contracts from trace seconds {lo:g} to {hi:g} at "
                       f"{doc['capacity']} blocks; refills share {doc['turnover_budget']:g} "
                       f"blocks/s; other groups: {doc['default']}", style="bold"))
    t = _table(None, ["group (label)", "created", "need /s", "need burst", "refill /s",
                      "burst", "owed"])
    for g in doc["groups"]:
        t.add_row(Text(printable(f"{g['group']} ({g['label']})")),
                  fmt(g["created_blocks"]), fmt(round(g["rate_need"], 3)),
                  fmt(round(g["burst_need"], 3)), fmt(g["refill"]), fmt(g["burst"]),
                  f"{100 * g['owed_share']:.2f}%")
    console.print(t)
    for g in doc["groups"]:
        for c in g["notes"]:
            console.print(Text(printable(f"{g['group']}: {c}")), soft_wrap=True)


def render_diff(console: Console, res, a, b) -> None:
    """The rows that differ between two receipts, then what changed and what regressed."""
    t = _table(None, ["run / scope / metric", "A", "B", "B - A"])
    for r in res.rows:
        if r["a"] != r["b"]:
            t.add_row(Text(printable(f"{r['run']} {r['select']} "
                                     f"{LABELS.get(r['metric'], r['metric'])}")),
                      fmt(r["a"]), fmt(r["b"]), fmt_diff(r["delta"], r["a"], r["b"]))
    if t.row_count:
        console.print(Text(f"psgate diff: A={a}  B={b}", style="bold"))
        console.print(t)
    else:
        console.print(Text(f"psgate diff: A={a}  B={b}: every headline metric is equal"))
    for line in res.config_changes:
        console.print(f"config: {line}", markup=False, highlight=False, soft_wrap=True)
    for line in res.gate_changes:
        console.print(f"gate: {line}", markup=False, highlight=False, soft_wrap=True)
    for line in res.regressions:
        console.print(Text.assemble(("REGRESSION", "red"), f" {line}"), soft_wrap=True)
    if not res.regressions:
        console.print(Text.assemble(("no regression", "green"), " of B against A"))
