"""`vllm serve` with the plugin, through a server's whole life.

One OpenAI-compatible server (tiny Qwen2, dummy weights, 64 blocks of 32 tokens, vLLM's
multiprocessing on) with PSGATE_POLICY=lru and its ledger, PSGATE_CAPTURE and
PSGATE_SHADOW=prefixshield; six tenant threads drive it with the `openai` client in three
phases: each re-reads its system prompt (hits), then all send long fresh requests at once
(evictions and preemptions), then each re-reads its system prompt again. The server is
stopped with SIGTERM and vLLM's default shutdown settings, as an orchestrator stops it.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from psgate import api
from psgate.engines.vllm_pool import tokens_for
from psgate.trace.redact import pseudonym, load_key

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "psgate" / "data" / "models" / "tiny-qwen2"
TENANTS = ["acme-secret", "globex-secret", "initech-secret", "umbrella-secret",
           "hooli-secret", "wonka-secret"]
BS, BLOCKS = 32, 64
SYSTEM_BLOCKS = 4           # each tenant's hot system prompt
FLOOD_BLOCKS = 8            # phase 2: fresh prompts ...
FLOOD_OUT = 160             # ... with long outputs: 6 x (8 + 6) blocks > 63 usable


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(proc, port: int, log: Path, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"vllm serve exited with {proc.returncode}:\n"
                        f"{log.read_text()[-4000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1)
    pytest.fail(f"vllm serve not ready in {timeout} s:\n{log.read_text()[-4000:]}")


def drive(port: int) -> dict[str, dict]:
    """Every tenant's requests; returns client request id -> what the client saw."""
    from openai import OpenAI
    client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0,
                    timeout=300)
    seen: dict[str, dict] = {}
    errors: list[BaseException] = []
    marks: list[float] = []
    barrier = threading.Barrier(len(TENANTS), action=lambda: marks.append(time.monotonic()))

    def ask(tenant: str, xid: str, prompt: list[int], out: int) -> None:
        r = client.completions.create(
            model=str(MODEL), prompt=prompt, max_tokens=out, temperature=0.0,
            extra_headers={"X-Request-Id": xid},
            extra_body={"cache_salt": tenant, "ignore_eos": True,
                        "vllm_xargs": {"psgate_group": tenant,
                                       "psgate_contract": "standard"}})
        details = r.usage.prompt_tokens_details
        seen[xid] = {"tenant": tenant, "id": r.id, "completion_tokens": r.usage.completion_tokens,
                     "cached": details.cached_tokens if details else None}

    def tenant_run(t: int, tenant: str) -> None:
        try:
            system = [x for j in range(SYSTEM_BLOCKS) for x in tokens_for(f"{tenant}.sys{j}",
                                                                           BS, 1000)]
            for k in range(2):                          # phase 1: the hot prompt, twice
                ask(tenant, f"{tenant}-a{k}", system + [100 + t] * (20 + k), 8)
            barrier.wait()
            for k in range(2):                          # phase 2: all at once, long outputs
                fresh = [x for j in range(FLOOD_BLOCKS)
                         for x in tokens_for(f"{tenant}.flood{k}.{j}", BS, 1000)]
                ask(tenant, f"{tenant}-b{k}", fresh + [7] * 5, FLOOD_OUT)
                barrier.wait()
            # A replay reserves every output block at admission, so it runs fewer of these
            # at once than the engine did and finishes them later; a pause as long as
            # phase 2 lets it catch up before phase 3 (the engine's hits are unaffected).
            time.sleep(marks[-1] - marks[0])
            for k in range(2):                          # phase 3: the hot prompt, twice
                ask(tenant, f"{tenant}-c{k}", system + [200 + t] * (20 + k), 8)
        except BaseException as exc:        # noqa: BLE001 - reported by the main thread
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=tenant_run, args=(t, name))
               for t, name in enumerate(TENANTS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if errors:
        raise errors[0]
    return seen


def serve(d: Path, psgate_env: dict[str, str], client, max_model_len: int = 512,
          model: Path = MODEL):
    """`vllm serve` of a tiny model (``model``'s config, dummy weights; BLOCKS blocks of BS
    tokens, vLLM's multiprocessing on) in ``d`` with ``psgate_env`` as its only PSGATE_
    settings, ``client(port)`` run against it, then SIGTERM with the default shutdown flags,
    as an orchestrator stops a server. Returns (what the client returned, seconds from
    SIGTERM to exit, exit code)."""
    vllm = Path(sys.executable).with_name("vllm")
    version = subprocess.run([str(vllm), "--version"], capture_output=True, text=True,
                             timeout=300)
    assert version.returncode == 0, (
        "`vllm` does not run in this environment; build it with scripts/install-vllm.sh:\n"
        + version.stderr[-1500:])
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PSGATE_")}
    env.update(VLLM_ENABLE_V1_MULTIPROCESSING="1", VLLM_CPU_KVCACHE_SPACE="1",
               PYTHONPATH=str(ROOT), **psgate_env)
    log = d / "server.log"
    cmd = [str(vllm), "serve", str(model), "--load-format", "dummy", "--skip-tokenizer-init",
           "--block-size", str(BS), "--num-gpu-blocks-override", str(BLOCKS),
           "--max-model-len", str(max_model_len), "--enable-prefix-caching", "--enforce-eager",
           "--enable-prompt-tokens-details", "--host", "127.0.0.1", "--port", str(port),
           "--seed", "0"]
    with open(log, "w") as logf:
        proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, env=env, cwd=d,
                                start_new_session=True)
        try:
            wait_ready(proc, port, log)
            seen = client(port)
            t = time.monotonic()
            proc.send_signal(signal.SIGTERM)    # the API server only, default shutdown flags
            proc.wait(timeout=120)
            stop_s = time.monotonic() - t
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    return seen, stop_s, proc.returncode


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    d = tmp_path_factory.mktemp("serve")
    (d / "key.hex").write_text("7e" * 16 + "\n")
    seen, stop_s, code = serve(d, {
        "PSGATE_POLICY": "lru", "PSGATE_LEDGER": str(d / "ledger.csv"),
        "PSGATE_CAPTURE": str(d / "cap"), "PSGATE_CAPTURE_KEY_FILE": str(d / "key.hex"),
        "PSGATE_SHADOW": "prefixshield"}, drive)
    print(f"\nserver stopped {stop_s:.1f} s after SIGTERM (exit {code})")
    return {"dir": d, "seen": seen, "log": (d / "server.log").read_text(), "key": load_key(
        str(d / "key.hex"), unkeyed=False)}


def capture_lines(served) -> list[dict]:
    files = json.loads((served["dir"] / "cap" / "capture-summary.json").read_text())["files"]
    return [json.loads(x) for f in files
            for x in (served["dir"] / "cap" / f).read_text().splitlines()]


def test_the_server_log_says_what_psgate_runs(served):
    lines = [x for x in served["log"].splitlines() if "psgate: policy lru (params sha256:" in x]
    assert len(lines) == 1, served["log"][-3000:]
    assert "capture -> " in lines[0] and "shadow prefixshield" in lines[0]
    assert "ledger.csv" in lines[0]


def test_sigterm_with_default_flags_completes_capture_and_shadow(served):
    cap = served["dir"] / "cap"
    assert not list(cap.rglob("*.part")), sorted(p.name for p in cap.rglob("*"))
    summary = json.loads((cap / "capture-summary.json").read_text())
    assert summary["events_dropped"] == 0
    assert summary["requests"] == len(served["seen"]) == 6 * len(TENANTS)
    for f in summary["files"]:
        proc = subprocess.run([sys.executable, "-m", "psgate", "validate", str(cap / f)],
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
    rep = json.loads((cap / "shadow" / "shadow-report.json").read_text())
    assert rep["live_policy"] == "lru" and set(rep["groups"]) == set(TENANTS)
    summaries = [json.loads(x) for x in (cap / "shadow" / "shadow.jsonl").read_text()
                 .splitlines()]
    assert summaries and summaries[-1]["final"] is True       # a run shorter than 60 s
    assert (cap / "shadow" / "shadow-evictions.jsonl").read_text().strip()


def test_evictions_and_preemptions_happened(served):
    dones = [x for x in capture_lines(served) if x.get("op") == "done"]
    assert sum(x["preemptions_observed"] for x in dones) >= 1
    assert all(x["out_observed"] == (FLOOD_OUT if x["out_observed"] > 8 else 8) for x in dones)
    rows = list(csv.DictReader((served["dir"] / "ledger.csv").open()))
    assert len(rows) >= 10


def test_ledger_speaks_the_client_ids_on_the_capture_clock(served):
    rows = list(csv.DictReader((served["dir"] / "ledger.csv").open()))
    lines = capture_lines(served)
    header = lines[0]
    assert {r["t0_unix"] for r in rows} == {f"{header['capture']['t0_unix']:.6f}"}
    last_t = max(x["t"] for x in lines if "t" in x)
    assert all(0 <= float(r["t_s"]) <= last_t + 1 for r in rows)
    client_ids = {s["id"] + "-0" for s in served["seen"].values()}    # vLLM adds "-<prompt>"
    assert {r["request"] for r in rows} <= client_ids


def test_replay_of_the_capture_matches_what_every_client_saw(served, tmp_path):
    key = served["key"]
    by_id = {x["id"]: x for x in capture_lines(served) if x.get("op") == "done"}
    client = {pseudonym("r", s["id"] + "-0", key): s["cached"] for s in served["seen"].values()}
    assert set(client) == set(by_id)
    assert {i: by_id[i]["cached_tokens_observed"] for i in client} == client
    cap = served["dir"] / "cap"
    files = json.loads((cap / "capture-summary.json").read_text())["files"]
    assert len(files) == 1
    cfg = api.ReplayConfig(trace=str(cap / files[0]), engine="vllm-pool", capacity=BLOCKS,
                           out=tmp_path / "o", allow_unexercised=True)
    api.replay(cfg)
    with open(tmp_path / "o" / "requests.csv") as f:
        replayed = {r["id"]: int(r["cached_tokens"]) for r in csv.DictReader(f)
                    if r["run"] == "baseline"}
    print(f"\nclient-observed cached tokens: {sorted(client.values())}")
    assert {i: replayed[i] for i in client} == client
    assert sum(1 for v in client.values() if v) >= 2 * len(TENANTS)       # hits happened


def test_the_capture_directory_replays_as_a_corpus(served, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "psgate", "replay", "--trace",
                           str(served["dir"] / "cap"), "--capacity", str(BLOCKS),
                           "--baseline", "lru", "--candidate", "prefixshield",
                           "--allow-unexercised", "--out", str(tmp_path / "o")],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode in (0, 1), proc.stderr[-2000:]


def test_no_tenant_request_id_or_model_path_in_the_capture(served):
    for f in (served["dir"] / "cap").iterdir():
        if f.is_dir():
            continue
        text = f.read_text()
        for secret in (*TENANTS, str(MODEL), "tiny-qwen2", "cmpl-"):
            assert secret not in text, (f, secret)
