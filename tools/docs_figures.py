"""Draw the docs' pictures from the bundled incident, with the HTML report's own figures.

    python tools/docs_figures.py            # rewrite docs/img/*.png (--out DIR: elsewhere)

The tutorial shows what `psgate report` draws for its receipt: each tenant's blocks lost to
eviction over time (the attack window shaded) and who evicted whom. The pictures are
drawn from a replay made here (examples/ci/incident.jsonl, lru against prefixshield, 96
blocks), not pasted.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from psgate import api  # noqa: E402
from psgate.report.html import (evictions_figure, hits_figure, lost_figure,  # noqa: E402
                                read_requests, require_plotting, sample_series)
from psgate.report.receipts import load_receipt  # noqa: E402

OUT = ROOT / "docs" / "img"


def main() -> int:
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=OUT, help="where the pictures go")
    out_dir = ap.parse_args().out
    require_plotting()
    import matplotlib.pyplot as plt
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "receipt"
        api.replay(api.ReplayConfig(trace=str(ROOT / "examples" / "ci" / "incident.jsonl"),
                                    baseline="lru", candidate="prefixshield", capacity=96,
                                    out=out))
        receipt = load_receipt(out)
        names = {run: receipt["config"][run]["name"] for run in ("baseline", "candidate")}
        series, window = sample_series(receipt, None)
        requests = read_requests(out)
        groups = sorted(receipt["runs"]["baseline"]["metrics"]["groups"])
        out_dir.mkdir(parents=True, exist_ok=True)
        for name, fig in (("incident-lost.png", lost_figure(plt, series, names, window)),
                          ("incident-hits.png", hits_figure(plt, requests, names, window)),
                          ("incident-evictions.png",
                           evictions_figure(plt, receipt, groups, names))):
            fig.savefig(out_dir / name, dpi=80, bbox_inches="tight",
                        metadata={"Software": None})
            plt.close(fig)
    return 0


if __name__ == "__main__":
    sys.exit(main())
