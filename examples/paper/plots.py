"""fig2.png to fig5.png from the collected results (results.collect) and the paper's
values: the same numbers as REPORT.md's tables, drawn. Needs matplotlib."""

from __future__ import annotations

from pathlib import Path

from experiment import paper_values


def draw(out: Path, data: dict) -> None:
    import matplotlib
    matplotlib.use("Agg")
    _fig2(out, data)
    _fig3(out, data)
    _fig4(out, data)
    _fig5(out, data)


def _err(e: dict) -> list[list[float]]:
    lo, hi, mean = e["diff_ci_low"], e["diff_ci_high"], e["diff_mean"]
    return [[(mean - lo) * 100 if lo is not None else 0],
            [(hi - mean) * 100 if hi is not None else 0]]


def _save(fig, path: Path) -> None:
    """Every figure is laid out, written at one resolution and closed the same way."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _fig2(out: Path, data: dict) -> None:
    import matplotlib.pyplot as plt

    paper = paper_values()
    fig, axes = plt.subplots(1, 3, figsize=(15, 3.8))
    ax = axes[0]
    rows = data["capacity"]
    for i, r in enumerate(rows):
        ax.errorbar([r["capacity"]], [r["e"]["diff_mean"] * 100], yerr=_err(r["e"]), fmt="o",
                    color="C0", label="psgate" if i == 0 else None, capsize=3)
    ax.plot([r["capacity"] for r in rows], [r["paper"] for r in rows], "s--", color="C1",
            label="paper")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("configured blocks")
    ax.set_ylabel("victim hit gain over LRU (pp)")
    ax.set_title("one-touch: gain vs capacity")
    ax.legend()
    ax = axes[1]
    for i, r in enumerate(data["pressure"]):
        gain = r["e"]["diff_mean"] * 100
        ax.errorbar([r["observed"]], [gain], yerr=_err(r["e"]), fmt="o", color="C0",
                    label="psgate (observed ratio)" if i == 0 else None, capsize=3)
        if r["ratio"] is None:
            ax.annotate("default", (r["observed"], gain), textcoords="offset points",
                        xytext=(-10, 8), fontsize=8)
    cp = paper["creation_pressure"]
    ax.plot([p["ratio"] for p in cp], [p["gain_pp"] for p in cp], "s--", color="C1",
            label="paper")
    ax.set_xscale("log")
    ax.set_xlabel("creation-pressure ratio (creation rate / refill)")
    ax.set_title("one-touch: gain vs creation pressure")
    ax.legend()
    ax = axes[2]
    for i, r in enumerate(data["load"]):
        ax.errorbar([r["alpha"] * 100], [r["e"]["diff_mean"] * 100], yerr=_err(r["e"]),
                    fmt="o", color="C0", label="psgate" if i == 0 else None, capsize=3)
    ax.plot([r["alpha"] * 100 for r in data["load"]], [r["paper"] for r in data["load"]],
            "s--", color="C1", label="paper")
    ax.set_xlabel("nominal load (%)")
    ax.set_title("one-touch: gain vs load")
    ax.legend()
    _save(fig, out / "fig2.png")


def _fig3(out: Path, data: dict) -> None:
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    ax = axes[0]
    rows = data["ablation"]
    x = range(len(rows))
    ax.bar([i - 0.2 for i in x], [r["diff"] for r in rows], width=0.4, label="psgate")
    ax.bar([i + 0.2 for i in x], [r["paper"] for r in rows], width=0.4, label="paper")
    ax.set_xticks(list(x), [r["trace"] for r in rows], rotation=15)
    ax.set_ylabel("full minus no-segmentation (pp)")
    ax.set_title("segmentation ablation")
    ax.legend()
    ax = axes[1]
    fracs = sorted({r["delay"] for r in data["delayed"]})
    for j, cand in enumerate(("prefixshield", "prefixshield-nogate", "lru")):
        vals = [r["victim_evicted"] for r in data["delayed"] if r["policy"] == cand]
        ax.bar([i + (j - 1) * 0.27 for i in range(len(fracs))], vals, width=0.27, label=cand)
    ax.set_xticks(range(len(fracs)), [f"{f:g} x clearance" for f in fracs])
    ax.set_ylabel("victim blocks evicted (mean)")
    ax.set_title("delayed replay")
    ax.legend()
    _save(fig, out / "fig3.png")


def _fig4(out: Path, data: dict) -> None:
    import matplotlib.pyplot as plt

    attack = [r["values"] for r in data["tradeoff"] if r["scope"] == "victim"]
    benign = [r["values"] for r in data["tradeoff"] if r["scope"] == "all"]
    keys = ["lru", "s3fifo", "prefixshield", *[f"b={b}" for b in data["meta"]["bounds"]]]
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for i, k in enumerate(keys):
        xs = [v[k] for v in benign if v.get(k) is not None]
        ys = [v[k] for v in attack if v.get(k) is not None]
        if not xs or not ys:
            continue
        x, y = 100 * sum(xs) / len(xs), 100 * sum(ys) / len(ys)
        name = k if not k.startswith("b=") else f"prefixshield-b {k[2:]}"
        ax.scatter([x], [y], s=60, marker="o" if not k.startswith("b=") else "^",
                   color=f"C{i}", label=name)
    ax.set_xlabel("benign hit % (mean over the ShareGPT-like traces)")
    ax.set_ylabel("victim hit % (mean over the attack traces)")
    ax.set_title(f"protection vs benign hit rate ({data['meta']['configured']} blocks)")
    ax.legend(fontsize=8)
    _save(fig, out / "fig4.png")


def _fig5(out: Path, data: dict) -> None:
    import matplotlib.pyplot as plt

    benign, psb = data["benign"], data["psb"]
    kinds = list(dict.fromkeys(r["trace"] for r in benign))
    fig, axes = plt.subplots(2, 3, figsize=(13, 7.5))
    axes = axes.ravel()
    names = {"lru": "LRU", "s3fifo": "S3-FIFO", "prefixshield": "PrefixShield",
             "prefixshield-b": "prefixshield-b"}
    for ax, kind in zip(axes, kinds):
        rows = [r for r in benign if r["trace"] == kind]
        for i, (pol, name) in enumerate(names.items()):
            ax.plot([r["capacity"] for r in rows], [r[pol] * 100 for r in rows],
                    marker="o^sD"[i], color=f"C{i}", label=name)
        ax.set_xscale("log", base=2)
        ax.set_xlabel(f"configured blocks ({rows[0]['block_tokens']} tokens each)")
        ax.set_ylabel("hit % (all requests)")
        ax.set_title(kind)
        ax.legend(fontsize=7)
    ax = axes[len(kinds)] if len(kinds) < len(axes) else None
    if ax is not None and psb:
        for i, r in enumerate(psb):
            e = r["e"]
            ax.errorbar([i], [e["diff_mean"] * 100], yerr=_err(e), fmt="o", color="C3",
                        capsize=4)
        ax.axhline(0, color="grey", lw=0.8)
        ax.set_xticks(range(len(psb)), [r["trace"] for r in psb], rotation=15)
        ax.set_ylabel(f"victim hit, pp ({data['meta']['ci_level']}% CI)")
        ax.set_title("prefixshield-b minus PrefixShield (attacks)")
    for extra in axes[len(kinds) + (1 if psb else 0):]:
        extra.set_visible(False)
    _save(fig, out / "fig5.png")
