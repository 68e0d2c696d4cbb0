"""report: one self-contained HTML file per receipt (no network, plots inline as SVG).

Time series (per-group occupancy, PrefixShield debt) are not in the receipt, so the
report replays the receipt's trace and configuration once more and samples them;
without the trace it says so where those plots would be. Everything else comes
from receipt.json and requests.csv. Plots are drawn with matplotlib (the
``psgate[report]`` extra).
"""

from __future__ import annotations

import csv
import html
import io
from pathlib import Path

from psgate.engines.sim import NullRecorder
from psgate.errors import EngineUnavailable, InputError, PsgateError
from psgate.report.receipts import load_receipt, prepare_replay, replay_run

RUNS = ("baseline", "candidate")
MAX_SAMPLES = 400


def _plt():
    try:
        import matplotlib
    except ImportError:
        raise EngineUnavailable("psgate report draws its plots with matplotlib, which is not "
                                "installed; install it with: pip install 'psgate[report]'") from None
    matplotlib.use("Agg")
    matplotlib.rcParams["svg.fonttype"] = "path"       # text as paths: no font needed
    matplotlib.rcParams["svg.hashsalt"] = "psgate"     # stable ids across runs
    import matplotlib.pyplot as plt
    return plt


class _Sampler(NullRecorder):
    """Samples per-group occupancy (and PrefixShield debt) every ``every`` admissions."""

    hits = False

    def __init__(self, every: int) -> None:
        self.every = every
        self.n = 0
        self.engine = None
        self.t: list[float] = []
        self.occ: list[dict[str, int]] = []
        self.debt: list[dict[str, float]] = []

    def admission(self, now_ns, req, hits, allocated, new_blocks, note) -> None:
        self.n += 1
        if self.n % self.every:
            return
        e = self.engine
        self.t.append(now_ns / 1e9)
        self.occ.append({g: e.occ[i] for i, g in enumerate(e.group_names)})
        pol = e.policy
        if hasattr(pol, "raw_debt") and hasattr(pol, "gnames"):
            now = now_ns / 1e9
            self.debt.append({g: pol.raw_debt(i, now) for i, g in enumerate(pol.gnames)})


def sample_series(receipt: dict, trace: str | None) -> dict[str, _Sampler]:
    prepared = prepare_replay(receipt, trace)
    out = {}
    for run in RUNS:
        admitted = receipt["runs"][run]["counts"].get("admitted", 1)
        out[run] = sampler = _Sampler(max(1, admitted // MAX_SAMPLES))
        replay_run(receipt, prepared, run, sampler)
    return out


def _svg(fig) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    s = buf.getvalue()
    return s[s.index("<svg"):]


def _plot(title: str, pid: str, svg: str) -> str:
    return (f'<figure class="plot" id="plot-{pid}"><figcaption>{html.escape(title)}'
            f'</figcaption>{svg}</figure>')


def _read_requests(directory: Path) -> dict[str, list[dict]]:
    rows: dict[str, list[dict]] = {r: [] for r in RUNS}
    p = directory / "requests.csv"
    if not p.is_file():
        raise InputError("no requests.csv here", path=str(directory))
    with open(p, newline="", encoding="utf-8") as fh:
        for r in csv.DictReader(fh):
            rows.setdefault(r["run"], []).append(r)
    return rows


def _table(headers: list[str], rows: list[list]) -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{html.escape('-' if c is None else str(c))}</td>"
                                    for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def build_report(directory: str | Path, trace: str | None = None) -> str:
    plt = _plt()
    directory = Path(directory)
    receipt = load_receipt(directory)
    requests = _read_requests(directory)
    names = {run: receipt["config"][run]["name"] for run in RUNS}
    sections: list[str] = []
    plots: list[str] = []

    # time series from a replay
    try:
        series = sample_series(receipt, trace)
    except PsgateError as exc:
        series = None
        sections.append(f'<p class="note">Time series need the trace: {html.escape(str(exc))}'
                        f'</p>')
    if series:
        fig, axes = plt.subplots(1, 2, figsize=(11, 3.4), sharey=True)
        for ax, run in zip(axes, RUNS):
            s = series[run]
            for g in sorted({g for o in s.occ for g in o}):
                ax.plot(s.t, [o.get(g, 0) for o in s.occ], label=g, linewidth=1.2)
            ax.set_title(f"{run}: {names[run]}")
            ax.set_xlabel("trace time (s)")
            ax.axhline(receipt["config"]["usable_blocks"], color="grey", linestyle=":")
        axes[0].set_ylabel("blocks held")
        axes[1].legend(fontsize=7, loc="best")
        plots.append(_plot("Per-group occupancy over time (dotted: usable blocks)",
                           "occupancy", _svg(fig)))
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
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.4), sharey=True)
    for ax, run in zip(axes, RUNS):
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
            ax.plot(xs, ys, label=role, linewidth=1.2)
        ax.set_title(f"{run}: {names[run]}")
        ax.set_xlabel("arrival time (s)")
        ax.set_ylim(0, 1.02)
    axes[0].set_ylabel("hit fraction (rolling mean)")
    axes[1].legend(fontsize=7)
    plots.append(_plot("Hit fraction over time per role", "hits", _svg(fig)))
    plt.close(fig)

    # TTFT distributions
    fig, ax = plt.subplots(figsize=(11, 3.2))
    for run in RUNS:
        ttft = sorted(float(r["ttft_ms"]) for r in requests.get(run, [])
                      if r["ttft_ms"] and r["measure"] == "1")
        if ttft:
            ax.step(ttft, [(i + 1) / len(ttft) for i in range(len(ttft))], where="post",
                    label=f"{run}: {names[run]}")
    ax.set_xlabel("TTFT (ms, modeled)")
    ax.set_ylabel("fraction of requests")
    ax.legend(fontsize=8)
    plots.append(_plot("TTFT distribution (cumulative, measured requests)", "ttft", _svg(fig)))
    plt.close(fig)

    # who evicted whom
    groups = sorted({g for run in RUNS for g in receipt["runs"][run]["metrics"]["groups"]})
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6))
    for ax, run in zip(axes, RUNS):
        by = receipt["runs"][run]["metrics"]["evictions_by"]
        m = [[by.get(a, {}).get(b, 0) for b in groups] for a in groups]
        im = ax.imshow(m, cmap="Reds")
        ax.set_xticks(range(len(groups)), groups, rotation=45, ha="right", fontsize=7)
        ax.set_yticks(range(len(groups)), groups, fontsize=7)
        ax.set_xlabel("owning group (lost blocks)")
        ax.set_ylabel("requesting group")
        ax.set_title(f"{run}: {names[run]}")
        for i, row in enumerate(m):
            for j, v in enumerate(row):
                ax.text(j, i, str(v), ha="center", va="center", fontsize=7)
        fig.colorbar(im, ax=ax, shrink=0.8)
    plots.append(_plot("Who evicted whom", "evictions", _svg(fig)))
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(11, 3.0))
    width = 0.4
    for k, run in enumerate(RUNS):
        paid = receipt["runs"][run]["metrics"]["recompute_paid_tokens"]
        ax.bar([i + k * width for i in range(len(groups))], [paid.get(g, 0) for g in groups],
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
            ["baseline", f"{names['baseline']} {receipt['config']['baseline']['params']}"],
            ["candidate", f"{names['candidate']} {receipt['config']['candidate']['params']}"],
            ["cost model", "modeled: " + ", ".join(
                f"{k}={v}" for k, v in receipt["config"]["cost_model"].items()
                if k not in ("label", "source"))],
            ["psgate", receipt["tool"]["version"]],
            ["python", receipt.get("environment", {}).get("python")]]
    verdict = gate["result"].upper()
    body = f"""
<h1>psgate receipt: <span class="{gate['result']}">{verdict}</span></h1>
<p>{html.escape(receipt['trace']['path'])} replayed under <b>{html.escape(names['baseline'])}</b>
(baseline) and <b>{html.escape(names['candidate'])}</b> (candidate);
{gate['num_checks'] - gate['num_failed']}/{gate['num_checks']} gate checks passed.
Times are modeled by the cost model, not observed.</p>
<h2>Gate</h2>{_table(["verdict", "check", "metric", "op", "threshold", "observed", "note"],
                     gate_rows)}
<h2>Metrics</h2>{_table(["run", "scope", "hit fraction", "token hit ratio", "saved tokens",
                        "TTFT p95 ms", "evictions"], metric_rows)}
<h2>Plots</h2>{''.join(sections)}{''.join(plots)}
<h2>Who evicted whom</h2>{_table(["run", "requesting group", "owning group", "evictions"],
                                by_rows)}
<h2>Invariants</h2>{_table(["run", "invariant", "verdict", "checks", "violations",
                           "first violation"], inv_rows)}
<h2>Provenance</h2>{_table(["", ""], prov)}
<pre id="psgate-selfcheck"></pre>
"""
    return PAGE.replace("{BODY}", body)


PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>psgate report</title>
<style>
body { font-family: sans-serif; margin: 2em; max-width: 1200px; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 0.85em; }
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
    JSON.stringify({plots: plots, errors: psgateErrors});
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
