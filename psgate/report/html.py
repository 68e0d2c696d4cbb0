"""report: one self-contained HTML file per receipt (no network, plots inline as SVG).

Time series (per-group occupancy, PrefixShield debt) are not in the receipt, so the
report replays the receipt's trace and configuration once more and samples them;
without the trace it says so where those plots would be. Everything else comes
from receipt.json and requests.csv. A matched-run experiment's report comes from its
receipt alone: run-level means and paired differences with their bootstrap intervals,
and every run's own numbers. Plots are drawn with matplotlib (the ``psgate[report]``
extra).
"""

from __future__ import annotations

import csv
import html
import io
from pathlib import Path

import orjson

from psgate.engines.base import NullRecorder
from psgate.errors import EngineUnavailable, InputError, PsgateError
from psgate.report.receipts import (load_receipt, prepare_replay, replay_run,
                                    resimulation_refusal, text_lines)
from psgate.report.render import times_label

RUNS = ("baseline", "candidate")
MAX_SAMPLES = 400
# Plots name at most this many groups; the rest share one row, column or bar.
MAX_PLOT_GROUPS = 24
# one colour per role in every panel, so that "attacker" is the same line left and right
ROLE_COLOURS = {"victim": "#1f77b4", "attacker": "#d62728", "benign": "#2ca02c",
                "(none)": "#7f7f7f"}
RUN_COLOURS = {"baseline": "#7f7f7f", "candidate": "#1f77b4"}

# What a receipt's times are: sim and vllm-pool model them, the real vLLM engine observes them
# (on the wall clock; under lockstep pacing its step clock models them).
TIMES = {"modeled": "Times are modeled by the cost model, not observed.",
         "observed": "Times are observed on the real vLLM runtime, not modeled."}


def _plt():
    try:
        import matplotlib
    except ImportError:
        raise EngineUnavailable("psgate report draws its plots with matplotlib, which is not "
                                "installed; install it with: pip install 'psgate[report]'"
                                ) from None
    matplotlib.use("Agg")
    matplotlib.rcParams["svg.fonttype"] = "path"       # text as paths: no font needed
    matplotlib.rcParams["svg.hashsalt"] = "psgate"     # stable ids across runs
    matplotlib.rcParams["text.parse_math"] = False     # a group named "$x$" is text
    import matplotlib.pyplot as plt
    return plt


class _Sampler(NullRecorder):
    """Samples per-group occupancy, blocks lost to eviction so far (by the group owning
    them) and PrefixShield debt every ``every`` admissions."""

    hits = False

    def __init__(self, every: int) -> None:
        self.every = every
        self.n = 0
        self.engine = None
        self.t: list[float] = []
        self.occ: list[dict[str, int]] = []
        self.lost: list[dict[str, int]] = []
        self.debt: list[dict[str, float]] = []
        self._lost: dict[str, int] = {}

    def eviction(self, now_ns, req, decision, block, hash_name, owner) -> None:
        self._lost[owner] = self._lost.get(owner, 0) + 1

    def admission(self, now_ns, req, hits, allocated, new_blocks, note) -> None:
        self.n += 1
        if self.n % self.every:
            return
        e = self.engine
        self.t.append(now_ns / 1e9)
        self.occ.append({g: e.occ[i] for i, g in enumerate(e.group_names)})
        self.lost.append(dict(self._lost))
        pol = e.policy
        if hasattr(pol, "raw_debt") and hasattr(pol, "gnames"):
            now = now_ns / 1e9
            self.debt.append({g: pol.raw_debt(i, now) for i, g in enumerate(pol.gnames)})


def sample_series(receipt: dict, trace: str | None
                  ) -> tuple[dict[str, _Sampler], tuple[float, float] | None]:
    """Each run's samples, and the incident window the trace names (None without)."""
    prepared = prepare_replay(receipt, trace, "drawing the time series")
    out = {}
    for run in RUNS:
        admitted = receipt["runs"][run]["counts"].get("admitted", 1)
        out[run] = sampler = _Sampler(max(1, admitted // MAX_SAMPLES))
        replay_run(receipt, prepared, run, sampler)
    return out, incident_window(prepared[1].raw)


def incident_window(header: dict) -> tuple[float, float] | None:
    """The attack window a generated trace's header records (``attack_start_s`` and
    ``attack_end_s`` among its generator's parameters), shaded in the time plots; a
    captured or imported trace names none."""
    params = (header.get("generator") or {}).get("params") or {}
    a, b = params.get("attack_start_s"), params.get("attack_end_s")
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and a < b:
        return float(a), float(b)
    return None


def _mark_window(ax, window: tuple[float, float] | None) -> None:
    if window is not None:
        ax.axvspan(*window, color="#d62728", alpha=0.08, zorder=0,
                   label="attack window (from the trace)")


def lost_figure(plt, series: dict, names: dict[str, str], window):
    """Blocks each group has lost to eviction so far, over time, both runs side by side:
    when a tenant's blocks went, and whether the candidate slowed it."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.4), sharey=True)
    total: dict[str, int] = {}
    for run in RUNS:
        for g, n in (series[run].lost[-1] if series[run].lost else {}).items():
            total[g] = max(total.get(g, 0), n)
    shown, rest = _top_groups(total, MAX_PLOT_GROUPS)
    for ax, run in zip(axes, RUNS):
        s = series[run]
        _mark_window(ax, window)
        for i, g in enumerate(shown):
            ax.plot(s.t, [x.get(g, 0) for x in s.lost], label=g, linewidth=1.3,
                    color=f"C{i % 10}")
        if rest:
            ax.plot(s.t, [sum(x.get(g, 0) for g in rest) for x in s.lost],
                    label=f"({len(rest)} others)", linewidth=1.2, color="grey")
        ax.set_title(f"{run}: {names[run]}")
        ax.set_xlabel("trace time (s)")
    axes[0].set_ylabel("blocks lost to eviction (cumulative)")
    axes[1].legend(fontsize=7, loc="upper left")
    return fig


def _svg(fig) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    s = buf.getvalue()
    return s[s.index("<svg"):]


def _plot(title: str, pid: str, svg: str) -> str:
    return (f'<figure class="plot" id="plot-{pid}"><figcaption>{html.escape(title)}'
            f'</figcaption>{svg}</figure>')


def read_requests(directory: Path) -> dict[str, list[dict]]:
    """A receipt directory's requests.csv rows (plain or compressed), by run."""
    rows: dict[str, list[dict]] = {r: [] for r in RUNS}
    p = directory / "requests.csv"
    if not p.is_file():
        raise InputError("no requests.csv here", path=str(directory))
    for r in csv.DictReader(text_lines(p)):
        rows.setdefault(r.get("run"), []).append(r)
    return rows


def _table(headers: list[str], rows: list[list]) -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{html.escape('-' if c is None else str(c))}</td>"
                                    for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def hits_figure(plt, requests: dict[str, list[dict]], names: dict[str, str], window=None):
    """Rolling hit fraction per role, baseline and candidate side by side (the trace's
    attack window shaded where it records one)."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.4), sharey=True)
    for ax, run in zip(axes, RUNS):
        _mark_window(ax, window)
        rows = [r for r in requests.get(run, []) if r["measure"] == "1"
                and r["state"] in ("completed", "cancelled", "unfinished")]
        for role in sorted({r["role"] or "(none)" for r in rows}):
            pts = sorted((float(r["t"]), int(r["cached_tokens"]) / int(r["prompt_tokens"]))
                         for r in rows if (r["role"] or "(none)") == role)
            if not pts:
                continue
            w = max(1, len(pts) // 20)       # rolling mean over ~5% of the requests
            xs, ys, acc = [], [], 0.0
            for i, (t, f) in enumerate(pts):
                acc += f
                if i >= w:
                    acc -= pts[i - w][1]
                xs.append(t)
                ys.append(acc / min(i + 1, w))
            # clip_on=False and a margin below 0: a role that never hits (an attacker's
            # unseen prefixes) is a line along 0, not hidden under the axis
            ax.plot(xs, ys, label=role, linewidth=1.6, clip_on=False, zorder=3,
                    color=ROLE_COLOURS.get(role))
        ax.set_title(f"{run}: {names[run]}")
        ax.set_xlabel("arrival time (s)")
        ax.set_ylim(-0.05, 1.05)
    axes[0].set_ylabel("hit fraction (rolling mean)")
    axes[1].legend(fontsize=7)
    return fig


def _top_groups(weights: dict[str, int], limit: int) -> tuple[list[str], list[str]]:
    """The ``limit`` heaviest groups (ties by name) and the rest: a plot keeps one row or
    bar per group it names, so with thousands of tenants the rest share one."""
    ranked = sorted(weights, key=lambda g: (-weights[g], g))
    return sorted(ranked[:limit]), ranked[limit:]


def evictions_figure(plt, receipt: dict, groups: list[str], names: dict[str, str]):
    """Who evicted whom: requesting group x owning group, both runs on one colour scale;
    past MAX_PLOT_GROUPS groups, the most involved ones and one row and column for the
    others (the full matrix is the receipt's evictions_by)."""
    involved = dict.fromkeys(groups, 0)
    for run in RUNS:
        for a, row in receipt["runs"][run]["metrics"]["evictions_by"].items():
            for b, n in row.items():
                involved[a] = involved.get(a, 0) + n
                involved[b] = involved.get(b, 0) + n
    shown, rest = _top_groups(involved, MAX_PLOT_GROUPS)
    axis = {g: i for i, g in enumerate(shown)}
    if rest:
        for g in rest:
            axis[g] = len(shown)
        shown = shown + [f"({len(rest)} others)"]
    mats = {}
    for run in RUNS:
        m = [[0] * len(shown) for _ in shown]
        for a, row in receipt["runs"][run]["metrics"]["evictions_by"].items():
            for b, n in row.items():
                m[axis[a]][axis[b]] += n
        mats[run] = m
    groups = shown
    # one colour scale for both panels, or the same colour means different counts
    vmax = max([v for m in mats.values() for row in m for v in row] + [1])
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), layout="constrained")
    for ax, run in zip(axes, RUNS):
        m = mats[run]
        im = ax.imshow(m, cmap="Reds", vmin=0, vmax=vmax)
        ax.set_xticks(range(len(groups)), groups, rotation=45, ha="right", fontsize=7)
        ax.set_yticks(range(len(groups)), groups, fontsize=7)
        ax.set_xlabel("owning group (lost blocks)")
        ax.set_ylabel("requesting group")
        ax.set_title(f"{run}: {names[run]}")
        for i, row in enumerate(m):
            for j, v in enumerate(row):
                ax.text(j, i, str(v), ha="center", va="center", fontsize=7,
                        color=_text_colour(v, vmax))
    fig.colorbar(im, ax=list(axes), shrink=0.8, label="evicted blocks (both panels)")
    return fig


def build_report(directory: str | Path, trace: str | None = None) -> str:
    plt = _plt()
    directory = Path(directory)
    receipt = load_receipt(directory, experiment_ok=True)
    if "psgate_experiment" in receipt:
        return build_experiment_report(directory, receipt, plt)
    requests = read_requests(directory)
    names = {run: receipt["config"][run]["name"] for run in RUNS}
    sections: list[str] = []
    plots: list[str] = []

    # time series from a replay, which runs sim
    refusal = resimulation_refusal(receipt, "drawing the time series")
    series, window = None, None
    if refusal:
        sections.append(f'<p class="note">No time series: {html.escape(refusal)}</p>')
    else:
        if receipt["config"]["engine"] == "vllm-pool":
            sections.append('<p class="note">Time series are re-simulated with sim, which the '
                            'conformance suite proves equal to vllm-pool.</p>')
        try:
            series, window = sample_series(receipt, trace)
        except PsgateError as exc:
            sections.append(f'<p class="note">Time series need the trace: '
                            f'{html.escape(str(exc))}</p>')
    if series:
        fig, axes = plt.subplots(1, 2, figsize=(11, 3.4), sharey=True)
        for ax, run in zip(axes, RUNS):
            s = series[run]
            peak: dict[str, int] = {}
            for o in s.occ:
                for g, n in o.items():
                    peak[g] = max(peak.get(g, 0), n)
            shown, rest = _top_groups(peak, MAX_PLOT_GROUPS)
            for g in shown:
                ax.plot(s.t, [o.get(g, 0) for o in s.occ], label=g, linewidth=1.2)
            if rest:
                ax.plot(s.t, [sum(o.get(g, 0) for g in rest) for o in s.occ],
                        label=f"({len(rest)} others)", linewidth=1.2, color="grey")
            ax.set_title(f"{run}: {names[run]}")
            ax.set_xlabel("trace time (s)")
            ax.axhline(receipt["config"]["usable_blocks"], color="grey", linestyle=":")
        axes[0].set_ylabel("blocks held")
        axes[1].legend(fontsize=7, loc="best")
        plots.append(_plot("Per-group occupancy over time (dotted: usable blocks)",
                           "occupancy", _svg(fig)))
        plt.close(fig)
        fig = lost_figure(plt, series, names, window)
        plots.append(_plot("Blocks each group lost to eviction over time" + (
            " (shaded: the attack window the trace records)" if window else ""),
            "lost", _svg(fig)))
        plt.close(fig)
        debt_runs = [run for run in RUNS if series[run].debt]
        fig, ax = plt.subplots(figsize=(11, 3.2))
        for run in debt_runs:
            s = series[run]
            for g in sorted({g for d in s.debt for g in d}):
                ax.plot(s.t, [d.get(g, 0.0) for d in s.debt], label=f"{run}: {g}",
                        linewidth=1.2, linestyle="-" if run == "candidate" else "--")
        if not debt_runs:
            ax.text(0.5, 0.5, "no PrefixShield-family policy in this receipt: no creation debt",
                    ha="center", va="center", transform=ax.transAxes)
        else:
            ax.legend(fontsize=7)
        ax.set_xlabel("trace time (s)")
        ax.set_ylabel("raw creation debt (blocks)")
        plots.append(_plot("PrefixShield creation debt per group over time", "debt", _svg(fig)))
        plt.close(fig)

    # hit fraction over time per role, from requests.csv
    fig = hits_figure(plt, requests, names, window)
    plots.append(_plot("Hit fraction over time per role", "hits", _svg(fig)))
    plt.close(fig)

    # TTFT distributions
    clock = times_label(receipt)
    fig, ax = plt.subplots(figsize=(11, 3.2))
    for run in RUNS:
        ttft = sorted(float(r["ttft_ms"]) for r in requests.get(run, [])
                      if r["ttft_ms"] and r["measure"] == "1")
        if ttft:
            ax.step(ttft, [(i + 1) / len(ttft) for i in range(len(ttft))], where="post",
                    label=f"{run}: {names[run]}")
    ax.set_xlabel(f"TTFT (ms, {clock})")
    ax.set_ylabel("fraction of requests")
    ax.legend(fontsize=8)
    plots.append(_plot("TTFT distribution (cumulative, measured requests)", "ttft", _svg(fig)))
    plt.close(fig)

    # who evicted whom
    groups = sorted({g for run in RUNS for g in receipt["runs"][run]["metrics"]["groups"]})
    fig = evictions_figure(plt, receipt, groups, names)
    plots.append(_plot("Who evicted whom (one colour scale for both runs)", "evictions",
                       _svg(fig)))
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(11, 3.0))
    width = 0.4
    paid = {run: receipt["runs"][run]["metrics"]["recompute_paid_tokens"] for run in RUNS}
    groups, rest = _top_groups({g: sum(paid[run].get(g, 0) for run in RUNS) for g in groups},
                               MAX_PLOT_GROUPS)
    bars = {run: [paid[run].get(g, 0) for g in groups] for run in RUNS}
    if rest:
        groups = groups + [f"({len(rest)} others)"]
        for run in RUNS:
            bars[run].append(sum(paid[run].get(g, 0) for g in rest))
    for k, run in enumerate(RUNS):
        ax.bar([i + k * width for i in range(len(groups))], bars[run],
               width, label=f"{run}: {names[run]}")
    ax.set_xticks([i + width / 2 for i in range(len(groups))], groups, fontsize=7)
    ax.set_ylabel("tokens recomputed")
    ax.legend(fontsize=8)
    plots.append(_plot("Recomputation each group paid for its own evicted blocks",
                       "recompute", _svg(fig)))
    plt.close(fig)

    # tables
    gate = receipt["gate"]
    gate_rows = [[c["verdict"].upper(), c["name"], c["metric"], c["op"], c["threshold"],
                  c["observed"], c.get("note", "")] for c in gate["checks"]]
    inv_rows = [[run, n, "holds" if v["holds"] else "VIOLATED", v["checks"], v["violations"],
                 v["first_violation"] or ""]
                for run in RUNS for n, v in receipt["runs"][run]["invariants"].items()]
    metric_rows = []
    for run in RUNS:
        m = receipt["runs"][run]["metrics"]
        for scope, vals in [("all", m["totals"])] + [(f"role {k}", v) for k, v in
                                                     m["roles"].items()] + \
                [(f"group {k}", v) for k, v in m["groups"].items()]:
            metric_rows.append([run, scope, vals.get("hit_fraction"),
                                vals.get("token_hit_ratio"), vals.get("saved_prefill_tokens"),
                                vals.get("ttft_p95_ms"),
                                vals.get("evictions", vals.get("evictions_suffered"))])
    by_rows = [[run, a, b, n] for run in RUNS
               for a, row in receipt["runs"][run]["metrics"]["evictions_by"].items()
               for b, n in row.items()]
    prov = [["trace", receipt["trace"]["path"]],
            ["trace file SHA-256", receipt["trace"].get("sha256")
             or receipt.get("environment", {}).get("trace_sha256")],
            ["canonical digest", receipt["trace"]["canonical_sha256"]],
            ["engine", receipt["config"]["engine"]],
            ["capacity (usable)", f"{receipt['config']['capacity']} "
                                  f"({receipt['config']['usable_blocks']})"],
            ["baseline", _policy(receipt["config"]["baseline"])],
            ["candidate", _policy(receipt["config"]["candidate"])],
            ["cost model", _cost_model(receipt["config"]["cost_model"])],
            ["psgate", receipt["tool"]["version"]],
            ["python", receipt.get("environment", {}).get("python")]]
    verdict = gate["result"].upper()
    body = f"""
<h1>psgate receipt: <span class="{gate['result']}">{verdict}</span></h1>
<p>{html.escape(receipt['trace']['path'])} replayed under <b>{html.escape(names['baseline'])}</b>
(baseline) and <b>{html.escape(names['candidate'])}</b> (candidate);
{gate['num_checks'] - gate['num_failed']}/{gate['num_checks']} gate checks passed.
{TIMES[clock]}</p>
<h2>Gate</h2>{_table(["verdict", "check", "metric", "op", "threshold", "observed", "note"],
                     gate_rows)}
<h2>Metrics</h2>{_table(["run", "scope", "hit fraction", "token hit ratio", "saved tokens",
                        "TTFT p95 ms", "evictions"], metric_rows)}
<h2>Plots</h2>{''.join(sections)}{''.join(plots)}
<h2>Who evicted whom</h2>{_table(["run", "requesting group", "owning group", "evictions"],
                                by_rows)}
<h2>Invariants</h2>{_table(["run", "invariant", "verdict", "checks", "violations",
                           "first violation"], inv_rows)}
<h2>Provenance</h2>{_table(["item", "value"], prov)}
<pre id="psgate-selfcheck"></pre>
"""
    return PAGE.replace("{BODY}", body)


def _text_colour(v: float, vmax: float) -> str:
    """White on the dark end of the colour map, black on the light end."""
    return "white" if v > 0.55 * vmax else "black"


def _value(v) -> str:
    return orjson.dumps(v, option=orjson.OPT_SORT_KEYS).decode()


def _policy(p: dict) -> str:
    """A policy as its name and ``key=value`` parameters (JSON values), not a Python repr."""
    params = p.get("params") or {}
    if not params:
        return f"{p['name']} (default parameters)"
    return f"{p['name']}: " + ", ".join(f"{k}={_value(v)}" for k, v in sorted(params.items()))


def _cost_model(cm: dict) -> str:
    coeffs = ", ".join(f"{k}={_value(v)}" for k, v in sorted(cm.items())
                       if k not in ("label", "source"))
    return f"{cm.get('label', 'modeled')} ({cm.get('source', 'unnamed')}): {coeffs}"


PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>psgate report</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body { font-family: sans-serif; margin: 2em; max-width: 1200px; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 0.85em;
        display: block; overflow-x: auto; max-width: 100%; }
td, th { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: left; }
th { background: #f2f2f2; }
.pass { color: #1a7f37; } .fail { color: #cf222e; }
figure.plot { margin: 1em 0; } figure.plot svg { max-width: 100%; height: auto; }
figcaption { font-weight: bold; margin-bottom: 0.3em; }
.note { color: #8a6d3b; }
#psgate-selfcheck { display: none; }
</style>
<script>
var psgateErrors = [];
window.addEventListener("error", function (e) { psgateErrors.push(String(e.message)); });
</script>
</head><body>{BODY}
<script>
window.addEventListener("load", function () {
  var plots = Array.prototype.map.call(document.querySelectorAll("figure.plot"), function (f) {
    var svg = f.querySelector("svg"), r = svg ? svg.getBoundingClientRect() : {width: 0, height: 0};
    return {id: f.id, width: r.width, height: r.height};
  });
  document.getElementById("psgate-selfcheck").textContent =
    JSON.stringify({plots: plots, errors: psgateErrors, viewport: window.innerWidth,
                    page: document.documentElement.scrollWidth});
});
</script>
</body></html>
"""


def write_report(directory: str | Path, out: str | Path, trace: str | None = None) -> Path:
    page = build_report(directory, trace)
    out = Path(out)
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(page, encoding="utf-8")
    tmp.replace(out)
    return out


# -- matched runs ------------------------------------------------------------------------

EXP_METRICS = ("hit_fraction", "token_hit_ratio", "saved_prefill_tokens", "ttft_p95_ms",
               "evictions", "evictions_suffered")
MAX_GROUP_ROWS = 16


def _scopes(metrics: dict) -> list[tuple[str, str, dict]]:
    """(label, key path, values) for all, each role and the first groups of a summary."""
    out = [("all", "totals", metrics["totals"])]
    out += [(f"role {k}", f"roles.{k}", v) for k, v in sorted(metrics.get("roles", {}).items())]
    out += [(f"group {k}", f"groups.{k}", v)
            for k, v in sorted(metrics.get("groups", {}).items())[:MAX_GROUP_ROWS]]
    return out


def _run_value(run: dict, side: str, path: str, metric: str):
    m = run["metrics"][side]
    if path == "totals":
        return m["totals"].get(metric)
    kind, _, name = path.partition(".")
    return m.get(kind, {}).get(name, {}).get(metric)


def _num(x, *like):
    """Rounded for reading: 4 decimals when the values compared (``like``, else ``x``)
    are below 10, 1 above."""
    if x is None:
        return None
    if isinstance(x, float):
        ref = max([abs(v) for v in like if isinstance(v, (int, float))] or [abs(x)])
        return round(x, 4 if ref < 10 else 1)
    return x


def _paired_plot(plt, receipt: dict, metric: str, label: str) -> str:
    """Per scope: every run's candidate - baseline (dots), the mean (diamond) and the
    paired bootstrap interval (bar); a vertical line at no difference."""
    s = receipt["summary"]
    runs = receipt["runs"]
    scopes = [(lbl, path, v) for lbl, path, v in _scopes(s) if metric in v]
    fig, ax = plt.subplots(figsize=(11, 0.45 * len(scopes) + 1.2))
    for y, (lbl, path, v) in enumerate(scopes):
        e = v[metric]
        diffs = []
        for r in runs:
            a, b = _run_value(r, "baseline", path, metric), _run_value(r, "candidate", path,
                                                                        metric)
            if isinstance(a, (int, float)) and isinstance(b, (int, float)):
                diffs.append(b - a)
        ax.scatter(diffs, [y] * len(diffs), s=16, color="#444444", zorder=5,
                   label="one run" if y == 0 else None)
        if e.get("diff_ci_low") is not None:
            ax.plot([e["diff_ci_low"], e["diff_ci_high"]], [y, y], color="#1f77b4",
                    linewidth=6, alpha=0.45, solid_capstyle="butt", zorder=3,
                    label="paired bootstrap interval" if y == 0 else None)
        if e.get("diff_mean") is not None:
            ax.scatter([e["diff_mean"]], [y], marker="D", s=36, color="#d62728", zorder=4,
                       label="mean difference" if y == 0 else None)
    ax.axvline(0, color="black", linewidth=0.8)
    ax.set_yticks(range(len(scopes)), [lbl for lbl, _, _ in scopes], fontsize=8)
    ax.set_ylim(len(scopes) - 0.5, -0.5)
    ax.set_xlabel(f"candidate - baseline: {label}")
    ax.legend(fontsize=7, loc="best")
    return _svg(fig)


def _runs_plot(plt, receipt: dict) -> str:
    """Hit fraction of every run under both policies: one line per run from baseline to
    candidate, one panel per scope (all and each role)."""
    runs = receipt["runs"]
    s = receipt["summary"]
    scopes = [("all", "totals")] + [(f"role {k}", f"roles.{k}") for k in sorted(s["roles"])]
    fig, axes = plt.subplots(1, len(scopes), figsize=(11, 3.2), sharey=True, squeeze=False)
    for ax, (lbl, path) in zip(axes[0], scopes):
        for r in runs:
            a = _run_value(r, "baseline", path, "hit_fraction")
            b = _run_value(r, "candidate", path, "hit_fraction")
            if a is None or b is None:
                continue
            ax.plot([0, 1], [a, b], color="#1f77b4" if b >= a else "#d62728", alpha=0.6,
                    marker="o", markersize=3, linewidth=1, clip_on=False)
        ax.set_xticks([0, 1], [receipt["config"]["baseline"]["name"],
                               receipt["config"]["candidate"]["name"]], fontsize=8)
        ax.set_xlim(-0.3, 1.3)
        ax.set_ylim(-0.05, 1.05)
        ax.set_title(lbl, fontsize=9)
    axes[0][0].set_ylabel("hit fraction (one line per run)")
    return _svg(fig)


def build_experiment_report(directory: Path, receipt: dict, plt) -> str:
    cfg = receipt["config"]
    s = receipt["summary"]
    gate = receipt["gate"]
    names = {run: cfg[run]["name"] for run in RUNS}
    level = cfg.get("bootstrap", {}).get("level", 0.95)
    clock = times_label(receipt)
    plots = [
        _plot(f"Hit fraction: per-run and paired difference with its {level:.0%} bootstrap "
              f"interval", "paired-hits", _paired_plot(plt, receipt, "hit_fraction",
                                                       "hit fraction")),
        _plot(f"p95 TTFT ({clock}): per-run and paired difference with its {level:.0%} "
              f"bootstrap interval", "paired-ttft",
              _paired_plot(plt, receipt, "ttft_p95_ms", f"p95 TTFT (ms, {clock})")),
        _plot("Hit fraction of every run under both policies", "runs", _runs_plot(plt, receipt)),
    ]
    plt.close("all")
    paired_rows = []
    for lbl, _, v in _scopes(s):
        for m in EXP_METRICS:
            if m in v:
                e = v[m]
                like = (e.get("baseline_mean"), e.get("candidate_mean"))
                paired_rows.append([lbl, m, _num(like[0]), _num(like[1]),
                                    _num(e.get("diff_mean"), *like),
                                    _num(e.get("diff_ci_low"), *like),
                                    _num(e.get("diff_ci_high"), *like),
                                    _num(e.get("rel_diff_mean")), e.get("n")])
    run_rows = []
    for r in receipt["runs"]:
        row = [r["id"], r.get("seed"), r["trace"]["path"], r["gate"].upper()]
        for m in ("hit_fraction", "ttft_p95_ms", "evictions"):
            a = _run_value(r, "baseline", "totals", m)
            b = _run_value(r, "candidate", "totals", m)
            d = None if a is None or b is None else b - a
            row += [_num(a), _num(b), _num(d, a, b)]
        row.append(r["receipt"])
        run_rows.append(row)
    gate_rows = [[c["verdict"].upper(), c["name"], c.get("metric"), c.get("op"),
                  c.get("threshold"), c.get("observed"), c.get("note", "")]
                 for c in gate["checks"]]
    src = receipt.get("source", {})
    if src.get("kind") == "workload":
        source = (f"workload {src.get('workload')} "
                  + (", ".join(f"{k}={_value(v)}" for k, v in sorted(src.get("params", {})
                                                                       .items()))
                     or "(default parameters)")
                  + f"; base seed {src.get('base_seed')}")
    else:
        source = f"corpus {src.get('directory', _value(src))}"
    prov = [["source", source],
            ["runs", s["num_runs"]],
            ["engine", cfg["engine"]],
            ["capacity (usable)", f"{cfg['capacity']} ({cfg['usable_blocks']})"],
            ["baseline", _policy(cfg["baseline"])],
            ["candidate", _policy(cfg["candidate"])],
            ["cost model", _cost_model(cfg["cost_model"])],
            ["interval", ", ".join(f"{k}={_value(v)}" for k, v in
                                   sorted(cfg.get("bootstrap", {}).items()))],
            ["psgate", receipt["tool"]["version"]]]
    verdict = gate["result"].upper()
    body = f"""
<h1>psgate matched runs: <span class="{gate['result']}">{verdict}</span></h1>
<p><b>{html.escape(names['baseline'])}</b> (baseline) and <b>{html.escape(names['candidate'])}</b>
(candidate) over {s['num_runs']} matched run(s) of {html.escape(source)};
{gate['num_checks'] - gate['num_failed']}/{gate['num_checks']} gate checks passed.
Numbers are run-level means; a difference is candidate - baseline, paired run by run, with a
{level:.0%} percentile-bootstrap interval over runs. {TIMES[clock]} Each run's own report:
<code>psgate report {html.escape(str(directory))}/runs/ID</code>.</p>
<h2>Gate</h2>{_table(["verdict", "check", "metric", "op", "threshold", "observed", "note"],
                     gate_rows)}
<h2>Paired differences</h2>{_table(["scope", "metric", "baseline mean", "candidate mean",
                                   "difference", f"{level:.0%} CI low", f"{level:.0%} CI high",
                                   "relative difference", "runs"], paired_rows)}
<h2>Plots</h2>{''.join(plots)}
<h2>Runs</h2>{_table(["run", "seed", "trace", "gate", "hit fraction A", "hit fraction B",
                      "B - A", "TTFT p95 A", "TTFT p95 B", "B - A", "evictions A",
                      "evictions B", "B - A", "receipt"], run_rows)}
<p>A = baseline ({html.escape(names['baseline'])}), B = candidate
({html.escape(names['candidate'])}), whole-run totals.</p>
<h2>Provenance</h2>{_table(["item", "value"], prov)}
<pre id="psgate-selfcheck"></pre>
"""
    return PAGE.replace("{BODY}", body)


# -- capacity curves ---------------------------------------------------------------------

def require_plotting() -> None:
    """Exit 3 with the install line before any work when matplotlib is missing."""
    _plt()


def _curve_axes(ax, capacities: list[int]) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(capacities)
    ax.set_xticklabels([str(c) for c in capacities], rotation=45, fontsize=7)
    ax.minorticks_off()
    ax.set_xlabel("configured blocks")
    ax.set_ylim(-0.02, 1.02)


def build_curve_report(doc: dict) -> str:
    """One self-contained page for a ``psgate curve`` document: hit fraction against
    capacity for every policy (all requests), per role and per group (the heaviest
    ``MAX_PLOT_GROUPS`` groups by measured requests, the rest named in a note), and the
    smallest capacity reaching the target, per group."""
    plt = _plt()
    caps = doc["capacities"]
    policies = doc["policies"]
    target = doc["target"]
    plots: list[str] = []

    fig, ax = plt.subplots(figsize=(7, 3.6))
    for name, entry in policies.items():
        ax.plot([p["capacity"] for p in entry["points"]],
                [p["totals"]["hit_fraction"] for p in entry["points"]], marker="o",
                markersize=3, linewidth=1.4, label=name)
    ax.axhline(target, color="grey", linestyle=":")
    _curve_axes(ax, caps)
    ax.set_ylabel("hit fraction (all requests)")
    ax.legend(fontsize=7)
    plots.append(_plot(f"Hit fraction against capacity, all requests (dotted: target "
                       f"{target:g})", "curve-totals", _svg(fig)))
    plt.close(fig)

    notes: list[str] = []
    for scope, title in (("roles", "role"), ("groups", "group")):
        weights: dict[str, int] = {}
        for entry in policies.values():
            for p in entry["points"]:
                for g, v in p[scope].items():
                    weights[g] = max(weights.get(g, 0), v["measured_requests"])
        if not weights:
            continue
        shown, rest = _top_groups(weights, MAX_PLOT_GROUPS)
        if rest:
            notes.append(f"{len(rest)} {title}s with the fewest measured requests are not "
                         f"drawn (the table and the JSON have them).")
        fig, axes = plt.subplots(1, len(policies), figsize=(4.2 * len(policies) + 1, 3.4),
                                 sharey=True, squeeze=False)
        for ax, (name, entry) in zip(axes[0], policies.items()):
            for i, g in enumerate(shown):
                pts = [(p["capacity"], p[scope][g]["hit_fraction"]) for p in entry["points"]
                       if p[scope].get(g, {}).get("hit_fraction") is not None]
                # one colour per name in every panel: a role's fixed one, a group's by rank
                colour = ROLE_COLOURS.get(g) if scope == "roles" else None
                if pts:
                    ax.plot(*zip(*pts), marker="o", markersize=2, linewidth=1.1, label=g,
                            color=colour or f"C{i % 10}")
            ax.axhline(target, color="grey", linestyle=":")
            _curve_axes(ax, caps)
            ax.set_title(name)
        axes[0][0].set_ylabel(f"hit fraction per {title}")
        axes[0][-1].legend(fontsize=6, loc="best")
        plots.append(_plot(f"Hit fraction against capacity per {title}", f"curve-{scope}",
                           _svg(fig)))
        plt.close(fig)

    rows = []
    for name, entry in policies.items():
        tc = entry["target_capacity"]
        rows.append([name, "all", "", tc["totals"]])
        rows += [[name, "role", r, c] for r, c in tc["roles"].items()]
        rows += [[name, "group", g, c] for g, c in tc["groups"].items()]
    points = [[name, p["capacity"], p["method"], p["totals"]["hit_fraction"],
               p["totals"]["token_hit_ratio"], p["totals"]["saved_prefill_tokens"]]
              for name, entry in policies.items() for p in entry["points"]]
    model = doc["replay_model"]
    body = f"""
<h1>psgate capacity curve</h1>
<p>{html.escape(doc['trace'])}: hit fraction against configured blocks under
{html.escape(', '.join(policies))}. Replay model: engine {html.escape(model['engine'])},
scheduler {html.escape(model['scheduler'])}, every cost coefficient 0, as
<code>{html.escape(model['command'])}</code> replays it.
A point marked one-pass is lru's exact one-pass curve; replay marks one replay at that
capacity.</p>
<h2>Plots</h2>{''.join(plots)}{''.join(f'<p class="note">{html.escape(n)}</p>' for n in notes)}
<h2>Smallest capacity reaching hit fraction {target:g}</h2>
{_table(["policy", "scope", "name", "configured blocks (- where none reaches it)"], rows)}
<h2>Points</h2>{_table(["policy", "configured blocks", "method", "hit fraction",
                       "token hit ratio", "saved prefill tokens"], points)}
<pre id="psgate-selfcheck"></pre>
"""
    return PAGE.replace("{BODY}", body)
