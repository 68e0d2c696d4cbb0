"""The human table of a bench result."""

from __future__ import annotations



def _num(x: float, unit: str) -> str:
    if unit == "s":
        return f"{x:.3f}"
    if unit == "us":
        return f"{x:.2f}"
    return f"{x:,.0f}"


def render(result: dict) -> str:
    """The human table: measurements (min / median) and targets (ratio, PASS/MISS)."""
    lines = []
    mach = result["machine"]
    load = mach.get("loadavg_start")
    lines.append(f"psgate bench {'--quick ' if result['quick'] else ''}(psgate "
                 f"{result['psgate_version']}, Python {mach['python']}, {mach['cpus']} CPUs"
                 + (f", load average {load[0]:.2f} at start" if load else "")
                 + f"; {result['repeats']} repeats; {result['wall_s']:.0f} s)")
    lines.append("clocks: " + "; ".join(f"{k}: {v}" for k, v in result["clocks"].items()))
    v = result["vllm"]
    lines.append(f"vLLM: {v['version']}" if v.get("version") else f"vLLM: {v['note']}")
    lines.append("traces: " + "; ".join(
        f"{k} {t['requests']} requests, {t['blocks']} blocks, capacity {t['capacity']}"
        for k, t in result["traces"].items()))
    lines.append("")
    w = max(len(x["what"]) for x in result["measurements"].values())
    lines.append(f"{'measurement':<{w}}  {'unit':>4}  {'min':>10}  {'median':>10}  "
                 f"{'blocks/s (min)':>14}")
    for x in result["measurements"].values():
        bps = f"{x['blocks_per_s']:,.0f}" if "blocks_per_s" in x else ""
        lines.append(f"{x['what']:<{w}}  {x['unit']:>4}  {_num(x['min'], x['unit']):>10}  "
                     f"{_num(x['median'], x['unit']):>10}  {bps:>14}")
    lines.append("")
    w = max(len(t["what"]) for t in result["targets"])
    wid = max(len(t["id"]) for t in result["targets"])
    lines.append(f"{'target':<{wid}} {'what':<{w}}  {'ratio':>7}  {'(median)':>8}  {'goal':>7}  "
                 f"result")
    for t in result["targets"]:
        r = "" if t["ratio_min"] is None else f"{t['ratio_min']:.2f}"
        rm = "" if t["ratio_median"] is None else f"{t['ratio_median']:.2f}"
        note = f"  ({t['note']})" if t["result"] == "SKIP" and t["note"] else ""
        lines.append(f"{t['id']:<{wid}} {t['what']:<{w}}  {r:>7}  {rm:>8}  "
                     f"{t['op']} {t['threshold']:<4g}  {t['result']}{note}")
    return "\n".join(lines) + "\n"
