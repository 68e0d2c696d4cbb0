"""`vllm serve` with a user's own policy: the example package in examples/own-policy
(quota-lru), named each way a spec names a policy, and specs that do not load.

The package is installed with this interpreter's pip into a directory of its own
(``pip install --target``, no dependencies, no index), never into the vLLM
environment, and reaches the server through PYTHONPATH; importlib.metadata finds its
.dist-info there, so its ``psgate.policies`` entry point is found like an installed
one's. One server (tiny Qwen2, dummy weights, 64 blocks of 32 tokens, vLLM's
multiprocessing on, so the policy lives in the engine core) serves
``PSGATE_POLICY=quota-lru`` (the entry point) with ``PSGATE_SHADOW`` naming the
example's file (``.../policy.py:QuotaLRU``); a tenant re-reads a short system
prompt around another tenant's flood of fresh prompts, which quota-lru keeps from
evicting it (lru would not). ``module:Class`` is checked through vLLM's own plugin
loading on a model-less KV cache manager in a fresh interpreter: a second server
would double the file's time for the same install path. A spec that does not load
stops ``vllm serve`` at start, exit 2, with psgate's one line and no traceback; so
does one that loads but cannot run live (belady, static-quota), at the plugin's check.
"""

from __future__ import annotations

import configparser
import csv
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "psgate" / "data" / "models" / "tiny-qwen2"
EXAMPLE = ROOT / "examples" / "own-policy"
ENTRY_POINT, CLASS = "quota-lru", "QuotaLRU"
BS, BLOCKS = 32, 64
SHARE = 0.2                         # PSGATE_POLICY_CONFIG: quota-lru's share per tenant ...
QUOTA = int(SHARE * (BLOCKS - 1))   # ... of the usable blocks, in blocks
SYSTEM_BLOCKS = 4                   # the light tenant's system prompt
FLOOD_BLOCKS, FLOODS = 10, 8        # the flooder's fresh prompts: 80 blocks > 63 usable
RANK_FIELDS = {"rule", "group", "holding", "quota", "freed_t"}
START_S = 300                       # a server's start, generously (about 20 s here)
FAIL_S = 120                        # a spec that does not load must end `vllm serve` by then

# No proxy, whatever the environment says: every request goes to 127.0.0.1.
_local = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def healthy(port: int) -> bool:
    try:
        with _local.open(f"http://127.0.0.1:{port}/health", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def vllm_bin() -> Path:
    vllm = Path(sys.executable).with_name("vllm")
    version = subprocess.run([str(vllm), "--version"], capture_output=True, text=True,
                             timeout=300, env=server_env({}))
    assert version.returncode == 0, (
        "`vllm` does not run in this environment; build it with scripts/install-vllm.sh:\n"
        + version.stderr[-1500:])
    return vllm


def server_env(extra: dict, site: Path | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PSGATE_")}
    path = [str(site)] if site else []
    env.update({"VLLM_ENABLE_V1_MULTIPROCESSING": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
                "PYTHONPATH": os.pathsep.join(path + [str(ROOT)]), **extra})
    return env


def serve_cmd(port: int) -> list[str]:
    return [str(Path(sys.executable).with_name("vllm")), "serve", str(MODEL),
            "--load-format", "dummy", "--skip-tokenizer-init", "--block-size", str(BS),
            "--num-gpu-blocks-override", str(BLOCKS), "--max-model-len", "512",
            "--enable-prefix-caching", "--enforce-eager", "--enable-prompt-tokens-details",
            "--host", "127.0.0.1", "--port", str(port), "--seed", "0"]


@contextmanager
def server(env: dict, d: Path, name: str):
    """A `vllm serve` that is healthy; stopped with SIGTERM after the block, killed (its
    whole process group) whatever happens."""
    port = free_port()
    log = d / f"{name}.log"
    with open(log, "w") as logf:
        proc = subprocess.Popen(serve_cmd(port), stdout=logf, stderr=subprocess.STDOUT,
                                env=env, cwd=d, start_new_session=True)
        try:
            deadline = time.monotonic() + START_S
            while not healthy(port):
                if proc.poll() is not None:
                    pytest.fail(f"vllm serve exited with {proc.returncode}:\n"
                                f"{log.read_text()[-4000:]}")
                if time.monotonic() > deadline:
                    pytest.fail(f"vllm serve not ready in {START_S} s:\n"
                                f"{log.read_text()[-4000:]}")
                time.sleep(1)
            yield port
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=120)
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)     # the engine core too, if left
            except ProcessLookupError:
                pass
            if proc.poll() is None:
                proc.wait(timeout=60)


def complete(port: int, tenant: str, prompt: list[int], out: int) -> dict:
    body = {"model": str(MODEL), "prompt": prompt, "max_tokens": out, "temperature": 0.0,
            "ignore_eos": True, "cache_salt": tenant,
            "vllm_xargs": {"psgate_group": tenant, "psgate_contract": "standard"}}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions",
                                 data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with _local.open(req, timeout=120) as r:
        doc = json.load(r)
    assert doc["usage"]["completion_tokens"] == out, doc["usage"]
    return doc


def drive(port: int) -> list[int]:
    """The light tenant reads its system prompt twice, the flooder sends fresh prompts that
    overflow the cache, the light tenant reads its prompt again: its cached tokens, each
    time."""
    from psgate.engines.vllm_pool import tokens_for
    system = [t for j in range(SYSTEM_BLOCKS) for t in tokens_for(f"light.sys{j}", BS, 1000)]
    cached = []

    def light(k: int) -> None:
        doc = complete(port, "light", system + [100 + k] * 20, 4)
        cached.append((doc["usage"].get("prompt_tokens_details") or {})
                      .get("cached_tokens", 0))

    light(0)
    light(1)
    for k in range(FLOODS):
        fresh = [t for j in range(FLOOD_BLOCKS) for t in tokens_for(f"flood{k}.{j}", BS, 1000)]
        complete(port, "flood", fresh + [7] * 5, 4)
    light(2)
    return cached


# -- the example package, installed beside the vLLM environment ---------------------------
@pytest.fixture(scope="module")
def own(tmp_path_factory) -> dict:
    if not (EXAMPLE / "pyproject.toml").is_file():
        pytest.fail(f"{EXAMPLE}/pyproject.toml is missing: the example package is gone")
    d = tmp_path_factory.mktemp("own")
    src = d / "src"        # a copy: building writes build/ and *.egg-info beside the sources
    shutil.copytree(EXAMPLE, src, ignore=shutil.ignore_patterns(
        "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache"))
    site = d / "site"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation",
         "--no-index", "--no-cache-dir", "--disable-pip-version-check", "--quiet",
         "--target", str(site), str(src)],
        capture_output=True, text=True, timeout=300, env={**os.environ, "PIP_NO_INPUT": "1"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    infos = list(site.glob("*.dist-info"))
    assert len(infos) == 1, sorted(p.name for p in site.iterdir())
    eps = configparser.ConfigParser(delimiters=("=",))
    eps.optionxform = str
    eps.read(infos[0] / "entry_points.txt")
    value = eps["psgate.policies"][ENTRY_POINT].strip()      # module:Class
    module, _, cls = value.partition(":")
    assert cls == CLASS, value
    rel = Path(*module.split(".")).with_suffix(".py")
    assert (site / rel).is_file(), sorted(str(p.relative_to(site)) for p in site.rglob("*.py"))
    # The file spec names the example's own file, in the repository, not the installed copy.
    files = [p for p in EXAMPLE.glob(f"**/{rel.as_posix()}") if "build" not in p.parts]
    assert len(files) == 1, files
    return {"site": site, "module_spec": value, "file": files[0],
            "file_spec": f"{files[0]}:{CLASS}", "dist": infos[0].name.split("-")[0]}


def test_the_entry_point_is_found_on_pythonpath_alone(own):
    """What the server relies on: the --target directory on PYTHONPATH is enough for
    importlib.metadata (and so psgate) to find the entry point and its distribution."""
    code = ("import json; from psgate.policies import resolve; s = resolve('quota-lru'); "
            "print(json.dumps([s.kind, s.distribution, s.module, s.files]))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env=server_env({}, own["site"]))
    assert proc.returncode == 0, proc.stderr[-2000:]
    kind, dist, module, files = json.loads(proc.stdout.strip().splitlines()[-1])
    assert kind == "entry-point" and module == own["module_spec"].partition(":")[0]
    assert dist.replace("-", "_") == own["dist"]
    assert any(f.endswith("policy.py") for f in files)
    # ... and nothing of it is in the vLLM environment itself
    bare = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env=server_env({}))
    assert bare.returncode != 0 and "no such policy" in bare.stderr


# -- one server: the entry point live, the file as its shadow --------------------------------
@pytest.fixture(scope="module")
def served(own, tmp_path_factory) -> dict:
    vllm_bin()
    d = tmp_path_factory.mktemp("serve")
    (d / "policy.json").write_text(json.dumps({"params": {"share": SHARE}}))
    env = server_env({"PSGATE_POLICY": ENTRY_POINT, "PSGATE_LEDGER": str(d / "ledger.csv"),
                      "PSGATE_POLICY_CONFIG": str(d / "policy.json"),
                      "PSGATE_SHADOW": own["file_spec"],
                      "PSGATE_SHADOW_DIR": str(d / "shadow")}, own["site"])
    t = time.monotonic()
    with server(env, d, "server") as port:
        ready_s = time.monotonic() - t
        cached = drive(port)
    print(f"\nserver healthy after {ready_s:.1f} s, done after {time.monotonic() - t:.1f} s")
    return {"dir": d, "cached": cached, "log": (d / "server.log").read_text(),
            "ledger": list(csv.DictReader((d / "ledger.csv").open()))}


def test_the_server_log_names_the_entry_point_live_and_the_file_as_shadow(served, own):
    from psgate.policies import make_policy, resolve
    from psgate.vllm_plugin import params_digest
    # PSGATE_POLICY_CONFIG is the live policy's; the shadow runs with its defaults
    live = params_digest(make_policy(own["file_spec"], {"share": SHARE}))
    shadow = params_digest(make_policy(own["file_spec"], {}))
    lines = [x for x in served["log"].splitlines() if "psgate: policy " in x]
    assert len(lines) == 1, served["log"][-3000:]
    # the entry point's digest covers its installed package's files, the file spec's the file
    assert re.search(rf"psgate: policy {ENTRY_POINT} \(params sha256:{live}, code "
                     rf"sha256:[0-9a-f]{{16}}\), ", lines[0]), lines[0]
    code = resolve(own["file_spec"]).sha256[:16]
    assert f"shadow {own['file_spec']} (params sha256:{shadow}, code sha256:{code}) -> " \
        in lines[0], lines[0]
    assert str(served["dir"] / "ledger.csv") in lines[0]
    # vLLM logs tracebacks of its own (its renderer's warm-up without a tokenizer, its
    # output handler at SIGTERM); none of them passes through psgate's or the policy's code
    ours = (str(ROOT / "psgate"), str(own["file"].parent), str(own["site"]))
    assert not [x for x in served["log"].splitlines()
                if 'File "' in x and any(p in x for p in ours)]


def test_the_live_evictions_are_quota_lrus(served):
    rows = served["ledger"]
    assert len(rows) >= 10, "the flood must evict"
    ranks = [json.loads(r["rank"]) for r in rows]
    assert all(set(r) == RANK_FIELDS and r["quota"] == QUOTA for r in ranks), ranks[:3]
    over = [r for r, k in zip(rows, ranks) if k["rule"] == "over-quota"]
    assert over and all(k["holding"] > QUOTA for k in ranks if k["rule"] == "over-quota")
    assert all(r["queue"] == "flood/own" and r["victim_group"] == "flood" for r in over)
    assert all(r["queue"] == "all" for r, k in zip(rows, ranks) if k["rule"] == "lru")
    assert "light" not in {r["victim_group"] for r in rows}


def test_the_light_tenants_prompt_survives_the_flood(served):
    # lru would evict it: its blocks are the least recently freed when the flood comes
    assert served["cached"] == [0, SYSTEM_BLOCKS * BS, SYSTEM_BLOCKS * BS], served["cached"]


def test_the_shadow_ran_the_file(served):
    shadow = served["dir"] / "shadow"
    rep = json.loads((shadow / "shadow-report.json").read_text())
    assert rep["live_policy"] == ENTRY_POINT
    assert rep["shadow_policy"]["name"] == ENTRY_POINT
    assert set(rep["groups"]) == {"light", "flood"}
    light = rep["groups"]["light"]
    # the same policy on the same traffic: the light prompt survives in the shadow too
    assert light["shadow_hit_tokens"] == light["live_hit_tokens"] == 2 * SYSTEM_BLOCKS * BS
    lines = [json.loads(x) for x in (shadow / "shadow-evictions.jsonl").read_text()
             .splitlines()]
    assert any(x["shadow"] for x in lines) and all("light" not in x["shadow"] for x in lines)


# -- module:Class through vLLM's plugin loading ------------------------------------------------
IN_PROCESS = r"""
import json, logging, sys
logging.basicConfig(level=logging.INFO)     # psgate's INFO line, on stderr
from vllm import SamplingParams
from vllm.plugins import load_general_plugins
from vllm.v1.request import Request, RequestStatus
from psgate.engines.vllm_pool import make_kv_cache_manager, tokens_for

load_general_plugins()          # vLLM's entry point group: psgate's register()
mgr, hasher = make_kv_cache_manager(64, 32)
system = [t for j in range(4) for t in tokens_for(f"light.sys{j}", 32, 1000)]
cached = []
for i, who in enumerate(["light"] * 2 + ["flood"] * 8 + ["light"]):
    toks = (system + [100 + i] * 20 if who == "light" else
            [t for j in range(10) for t in tokens_for(f"flood{i}.{j}", 32, 1000)] + [7] * 5)
    req = Request(f"r{i}", toks, SamplingParams(max_tokens=4, extra_args={"psgate_group": who}),
                  None, cache_salt=who, block_hasher=hasher)
    computed, n_hit, _ = mgr.get_computed_blocks(req)
    assert mgr.allocate_slots(req, req.num_tokens - n_hit, num_new_computed_tokens=n_hit,
                              new_computed_blocks=computed) is not None
    if who == "light":
        cached.append(n_hit)
    req.status = RequestStatus.FINISHED_STOPPED
    mgr.free(req)
done = mgr._psgate_installs        # what the plugin installed, per manager
print(json.dumps({"queue": type(mgr.block_pool.free_block_queue).__name__,
                  "policy": type(done[0]["policy"].policy).__module__ + ":"
                            + type(done[0]["policy"].policy).__qualname__,
                  "cached": cached}))
"""


def test_module_class_spec_is_installed_by_the_plugin(own, tmp_path):
    ledger = tmp_path / "ledger.csv"
    (tmp_path / "policy.toml").write_text(f"[params]\nshare = {SHARE}\n")
    env = server_env({"PSGATE_POLICY": own["module_spec"], "PSGATE_LEDGER": str(ledger),
                      "PSGATE_POLICY_CONFIG": str(tmp_path / "policy.toml"),
                      "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}, own["site"])
    proc = subprocess.run([sys.executable, "-c", IN_PROCESS], capture_output=True, text=True,
                          timeout=300, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["queue"] == "PolicyFreeQueue"
    assert got["policy"] == own["module_spec"]
    assert got["cached"] == [0, SYSTEM_BLOCKS * BS, SYSTEM_BLOCKS * BS], got
    assert f"psgate: policy {own['module_spec']} (params sha256:" in proc.stdout + proc.stderr
    rows = list(csv.DictReader(ledger.open()))
    ranks = [json.loads(r["rank"]) for r in rows]
    assert rows and all(set(k) == RANK_FIELDS and k["quota"] == QUOTA for k in ranks)
    assert {r["queue"] for r, k in zip(rows, ranks) if k["rule"] == "over-quota"} \
        == {"flood/own"}


# -- specs that do not load: the server stops at start ------------------------------------
def _broken_file(own, d: Path) -> tuple[str, str]:
    text = own["file"].read_text()
    broken = d / "quota_lru_typo.py"
    broken.write_text(text + "\n\ndef select_victim(self, req, now_ns:\n    pass\n")
    line = len(text.splitlines()) + 3
    spec = f"{broken}:{CLASS}"
    return spec, f"psgate: error: PSGATE_POLICY: policy '{spec}': {broken}:{line}: syntax error: "


@pytest.mark.parametrize("case", ["missing-module", "syntax-error"])
def test_a_spec_that_does_not_load_stops_the_server_at_start(own, tmp_path, case):
    if case == "missing-module":
        spec = "no_such_module:Nope"
        expected = (f"psgate: error: PSGATE_POLICY: policy '{spec}': no module named "
                    f"'no_such_module' in this interpreter ({sys.executable}); ")
    else:
        spec, expected = _broken_file(own, tmp_path)
    port = free_port()
    env = server_env({"PSGATE_POLICY": spec, "PSGATE_LEDGER": str(tmp_path / "ledger.csv")},
                     own["site"])
    log = tmp_path / "server.log"
    t = time.monotonic()
    with open(log, "w") as logf:
        proc = subprocess.Popen(serve_cmd(port), stdout=logf, stderr=subprocess.STDOUT,
                                env=env, cwd=tmp_path, start_new_session=True)
        try:
            was_healthy = False
            while proc.poll() is None and time.monotonic() - t < FAIL_S:
                was_healthy = was_healthy or healthy(port)
                time.sleep(0.5)
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(timeout=60)
    took = time.monotonic() - t
    out = log.read_text()
    print(f"\n{case}: exit {proc.returncode} after {took:.1f} s")
    assert took < FAIL_S and proc.returncode == 2, (proc.returncode, out[-3000:])
    assert not was_healthy
    ours = [x for x in out.splitlines() if "psgate: error" in x]
    assert len(ours) == 1 and ours[0].startswith(expected), out[-3000:]
    assert "Traceback" not in out and "EngineCore" not in out, out[-3000:]
    assert not (tmp_path / "ledger.csv").exists()


@pytest.mark.parametrize("env, spec, why", [
    ("PSGATE_POLICY", "belady", "it needs the trace's future"),
    ("PSGATE_SHADOW", "static-quota", "it makes requests wait (admission control)")])
def test_a_policy_that_cannot_run_live_stops_the_plugin_at_start(tmp_path, env, spec, why):
    """Loads, but the live engine would refuse it in the engine core (a traceback after the
    model has loaded): the plugin's start check says so first, in the same one line."""
    proc = subprocess.run([sys.executable, "-c",
                           "from psgate.vllm_plugin import register; register()"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env=server_env({env: spec}))
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"psgate: error: {env}: policy '{spec}': {why}"), proc.stderr[-2000:]
