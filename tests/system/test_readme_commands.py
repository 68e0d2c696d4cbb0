"""Every shell example in README.md, examples/ci/README.md and the docs site runs as written.

Commands come from indented code blocks and ```sh fences: a line starting with
``psgate``, ``python``/``python3``, ``bash``, a virtualenv's ``bin/`` or an environment
assignment, with backslash continuations joined and trailing ``# comments`` dropped. Each
code block runs in a fresh temporary directory (commands of one block share it, as a
reader typing them would) holding the files the examples name. A command either runs as
written, runs as listed in SUBSTITUTED (scaled down, or a placeholder filled in), or is
listed in SKIPPED with the reason; a command in neither table runs as written, and a
table entry the README no longer has fails the test, so the tables stay honest.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import shell_blocks

ROOT = Path(__file__).resolve().parents[2]
# The README, the CI example's, and every page of the docs site but the generated references
# (their examples are option synopses, not commands).
GENERATED = {"docs/reference/cli.md", "docs/reference/trace-schema.md",
             "docs/reference/receipt-schema.md", "docs/policy-api.md"}
DOCS = {"README.md": ROOT / "README.md", "examples/ci/README.md": ROOT / "examples/ci/README.md",
        **{str(p.relative_to(ROOT)): p for p in sorted((ROOT / "docs").rglob("*.md"))
           if str(p.relative_to(ROOT)) not in GENERATED}}
EXAMPLE_TRACE = ROOT / "psgate" / "data" / "traces" / "example.jsonl"
PROGRAM = re.compile(r"^(psgate|python3?|bash|\.venv[\w.-]*/bin/\w+|[A-Z_]+=\S*)\s")

SKIPPED = {
    "python3 -m venv .venv && . .venv/bin/activate && pip install .":
        "the install alone (docs/index.md): the README's main job command makes the same "
        "install, and the tests run in one",
    "python3 -m venv .venv && . .venv/bin/activate && pip install -e '.[test]' && "
    "python -m pytest -q": "the whole test suite, of which this test is a part",
    "bash scripts/install-calibrate.sh .venv-calibrate":
        "installs torch and transformers from the package index (gigabytes)",
    ".venv-calibrate/bin/psgate calibrate --model-config examples/models/tiny-qwen2 --device "
    "cpu -o tiny-cpu.json": "needs the calibrate virtualenv (torch)",
    ".venv-calibrate/bin/psgate calibrate --model-config examples/models/qwen2.5-7b-instruct "
    "--device cuda -o my-gpu-7b.json": "needs torch and a GPU",
    "bash scripts/install-vllm.sh .venv-vllm": "installs vLLM from the package index (3.5 GB)",
    "PSGATE_POLICY=quota-lru vllm serve MODEL --enable-prefix-caching":
        "serves a model with vLLM; tests/vllm_suite/test_own_policy_serve.py serves quota-lru",
    "PSGATE_POLICY=prefixshield PSGATE_POLICY_CONFIG=policy.json "
    "PSGATE_LEDGER=/var/log/psgate-evictions.csv vllm serve MODEL --enable-prefix-caching":
        "serves a model with vLLM",
    "psgate bench [--quick] [--json] [--repeats N] [--vllm-python PY] [--policy SPEC]":
        "a synopsis; tests/bench/test_bench.py runs psgate bench --quick --json (about a minute)",
    "python tools/bench_prefixshield_b.py [--quick]":
        "about 5 minutes even with --quick on this machine",
    "python tools/bench_prefixshield_b.py --seeds 10 --variant "
    "'fill 0.75={\"evidence_fill\": 0.75}'": "replays the paper's workloads at 10 seeds",
    "bash scripts/install-vllm.sh .venv-vllm && .venv-vllm/bin/python "
    "tools/record_vllm_golden.py": "installs and drives vLLM",
    "python -m pytest tests/test_cli.py --update-golden":
        "rewrites the committed golden receipts",
    "python -m pytest tests/policies/test_golden.py --update-golden":
        "rewrites the committed golden policy outcomes",
    "python examples/paper/reproduce.py --quick":
        "minutes; .ci/run runs it after the tests, tests/system/test_paper_report.py runs --tiny",
    "python examples/paper/reproduce.py [--quick]":
        "minutes even with --quick; .ci/run runs it after the tests",
    "python examples/paper/evaluate.py [--report examples/paper/REPORT.md]":
        "a synopsis; replays the held-out set (minutes); tests/system/test_paper_evaluate.py runs "
        "a small protocol end to end",
    "python examples/paper/evaluate.py --set tuning --split --only sharegpt":
        "a minute of replays per capacity; tests/system/test_paper_evaluate.py runs the time "
        "split on a small protocol end to end",
    "python3 tools/calibrate_gpu.py --out examples/cost-models --prefix h200": "needs a GPU",
    "PSGATE_FUZZ_EXAMPLES=20000 python -m pytest tests/system/test_fuzz_soak.py -k fuzz -s":
        "tests/system/test_fuzz_soak.py runs in the suite at its default example count",
}

# README command -> (what runs instead, why)
SUBSTITUTED = {
    "python3 -m venv .venv && . .venv/bin/activate && pip install . && psgate replay "
    "--baseline lru --candidate prefixshield":
        ("psgate replay --baseline lru --candidate prefixshield",
         "psgate is installed here from this checkout; the main job runs as written"),
    "psgate replay --workload one-touch --runs 10 --seed 1 --baseline lru --candidate "
    "prefixshield --gate gate.toml --out exp":
        ("psgate replay --workload one-touch --runs 2 --seed 1 --baseline lru --candidate "
         "prefixshield --gate stat-gate.toml --out exp",
         "2 matched runs instead of 10; the gate file is the README's own stat checks"),
    "psgate explain review --request r1234":
        ("psgate explain review --request a50", "a request of the example trace"),
    "psgate replay --trace T.jsonl --baseline lru --candidate prefixshield --cost-model "
    "my-gpu-7b.json":
        ("psgate replay --trace T.jsonl --baseline lru --candidate prefixshield --cost-model "
         "examples/cost-models/h200-qwen2.5-7b.json",
         "the committed calibration instead of one measured on your GPU"),
    "python tools/profile_replay.py --policy prefixshield [--trace reuse|cold|debt] [--e2e] "
    "[--full]": ("python tools/profile_replay.py --policy prefixshield --trace debt --e2e",
                 "a synopsis; one of its forms"),
    "python tools/soak.py --traces 10000": ("python tools/soak.py --traces 20",
                                            "20 random traces instead of 10,000"),
    "python tools/fuzz_atheris.py trace -max_total_time=600":
        ("python tools/fuzz_atheris.py trace -runs=200", "200 inputs instead of 10 minutes"),
}

# stdout is one JSON object (or nothing) for every psgate command but these
NOT_JSON = {
    "psgate explain": "prints its text on stdout (one JSON object with --json)",
    "psgate summary receipt --format markdown": "the Markdown is the command's product",
}

# files the examples name, made in every block's directory
FIXTURES = {
    "raw.jsonl": "a raw request log of three requests with token ids",
    "T.jsonl": "the bundled example trace",
    "incident.jsonl": "the bundled example trace",
    "gate.toml": "examples/ci/gate.toml",
    "stat-gate.toml": "the README's code block of stat checks",
    "last-release/": "a receipt of the example trace, as the last release would have left",
    "receipt/": "the tutorial's receipt (the incident, lru against prefixshield, 96 blocks), "
                "for a block that reads it without writing it",
}


def _commands(block: list[str]) -> list[str]:
    cmds, cur = [], None
    for ln in block:
        if cur is not None:
            cur += " " + ln.strip()
        elif not ln.strip() or ln[:1].isspace():
            continue                       # blank, or a comment continued under a command
        else:
            cur = ln
        if cur.endswith("\\"):
            cur = cur[:-1].rstrip()
            continue
        cmd = re.sub(r"\s+", " ", re.sub(r"\s+#\s.*$", "", cur)).strip()
        if PROGRAM.match(cmd + " "):
            cmds.append(cmd)
        cur = None
    return cmds


def readmeshell_blocks() -> list[tuple[str, int, list[str]]]:
    out = []
    for doc, path in DOCS.items():
        for k, block in enumerate(shell_blocks(path.read_text())):
            cmds = _commands(block)
            if cmds:
                out.append((doc, k, cmds))
    return out


BLOCKS = readmeshell_blocks()


def test_tables_name_only_commands_the_readme_has():
    seen = {c for _, _, cmds in BLOCKS for c in cmds}
    assert not set(SKIPPED) - seen, sorted(set(SKIPPED) - seen)
    assert not set(SUBSTITUTED) - seen, sorted(set(SUBSTITUTED) - seen)
    assert len(seen) >= 20, sorted(seen)


def _stat_gate() -> str:
    """The README's stat checks (the block of TOML that uses ``stat``), as a gate file."""
    for block in shell_blocks(DOCS["docs/concepts/commands.md"].read_text()):
        text = "\n".join(block)
        if text.lstrip().startswith("[[check]]") and "stat = " in text:
            return text + "\n"
    raise AssertionError("docs/concepts/commands.md has no TOML block of stat checks")


def _env() -> dict:
    bin_dir = str(Path(sys.executable).parent)
    return dict(os.environ, PATH=bin_dir + os.pathsep + os.environ["PATH"], NO_COLOR="1",
                COLUMNS="100")


def _workdir(tmp_path: Path, cmds: list[str]) -> Path:
    for name in ("tools", "scripts", "examples", "tests"):
        (tmp_path / name).symlink_to(ROOT / name)
    text = " ".join(cmds)

    def wanted(name: str) -> bool:       # named, and not an output the block writes
        return re.search(rf"(^|[ /]){re.escape(name)}\b", text) is not None and \
            f"-o {name}" not in text

    if wanted("raw.jsonl"):
        (tmp_path / "raw.jsonl").write_text("".join(json.dumps({
            "t": 0.5 * i, "id": f"req-{i}", "group": "acme" if i % 2 else "beta",
            "contract": "standard", "model": "m", "tokenizer": "rev-1", "adapter": "",
            "cache_salt": "", "prompt_token_ids": list(range(40 + i)), "out": 8,
            "done_t": 0.5 * i + 0.2}) + "\n" for i in range(3)))
    for name in ("T.jsonl", "incident.jsonl"):
        if wanted(name):
            shutil.copy(EXAMPLE_TRACE, tmp_path / name)
    if wanted("gate.toml"):
        shutil.copy(ROOT / "examples" / "ci" / "gate.toml", tmp_path / "gate.toml")
    (tmp_path / "stat-gate.toml").write_text(_stat_gate())
    if re.search(r"\s(explain|report|summary|verify) receipt\b", text) and \
            "--out receipt" not in text:
        proc = subprocess.run(["psgate", "replay", "--trace", "examples/ci/incident.jsonl",
                               "--baseline", "lru", "--candidate", "prefixshield",
                               "--capacity", "96", "--out", "receipt", "--quiet"],
                              cwd=tmp_path, env=_env(), capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 0, proc.stderr
    if any("last-release" in c for c in cmds):
        proc = subprocess.run(["psgate", "replay", "--trace", "incident.jsonl", "--baseline",
                               "lru", "--candidate", "prefixshield", "--out", "last-release",
                               "--quiet"], cwd=tmp_path, env=_env(), capture_output=True,
                              text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
    return tmp_path


@pytest.mark.parametrize("doc,k,cmds", BLOCKS,
                         ids=[f"{doc}:{k}:{cmds[0][:40]}" for doc, k, cmds in BLOCKS])
def test_readme_block_runs(doc, k, cmds, tmp_path):
    runnable = [c for c in cmds if c not in SKIPPED]
    if not runnable:
        pytest.skip("; ".join(SKIPPED[c] for c in cmds))
    cwd = _workdir(tmp_path, cmds)
    for cmd in runnable:
        run = SUBSTITUTED[cmd][0] if cmd in SUBSTITUTED else cmd
        if "fuzz_atheris" in run:
            pytest.importorskip("atheris")
        proc = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", run], cwd=cwd, env=_env(),
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, f"{doc}: `{cmd}` exited {proc.returncode}:\n" \
                                     f"{proc.stderr[-3000:]}"
        assert "Traceback" not in proc.stderr, proc.stderr
        if run.startswith("psgate ") and not any(run.startswith(p) for p in NOT_JSON) \
                and proc.stdout.strip():
            lines = proc.stdout.strip().splitlines()
            assert len(lines) == 1, f"`{run}`: stdout is not one JSON object:\n{proc.stdout}"
            json.loads(lines[0])


def test_the_readme_policy_passes_the_contract_suite(tmp_path):
    """The policy docs/how-to/own-policy.md shows, as printed, is a policy
    psgate accepts: check-policy passes it and a replay gates it."""
    section = DOCS["docs/how-to/own-policy.md"].read_text()
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    (tmp_path / "my_lru.py").write_text(code)
    proc = subprocess.run(["psgate", "check-policy", "my_lru.py:MyLRU"], cwd=tmp_path,
                          env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = subprocess.run(["psgate", "replay", "--baseline", "lru", "--candidate",
                           "my_lru.py:MyLRU", "--out", "o", "--quiet"], cwd=tmp_path,
                          env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    receipt = json.loads((tmp_path / "o" / "receipt.json").read_text())
    assert receipt["config"]["candidate"]["source"]["kind"] == "file"
    assert receipt["runs"]["candidate"]["aborted"] is None
