"""The stack classifier behind tools/bench_vllm.py --attribute, on stacks in py-spy's raw
format (root first, sample count last)."""

import pytest

from psgate.bench.attribution import StackClassifier, overhead_pct

PSG = "/src/psgate"
STD = "/py/lib/python3.11"
SITE = f"{STD}/site-packages"
HEAD = 'process 10:"vllm serve";process 11:"VLLM::EngineCore";thread (11): MainThread'
LOOP = (f"{HEAD};run_engine_core ({SITE}/vllm/v1/engine/core.py:900);"
        f"EngineCoreProc.run_busy_loop ({SITE}/vllm/v1/engine/core.py:940)")


def line(stack: str, n: int) -> str:
    return f"{stack} {n}"


@pytest.fixture
def classifier():
    return StackClassifier(PSG, STD)


def test_innermost_non_stdlib_frame_decides(classifier):
    raw = "\n".join([
        # vLLM's own work in the loop
        line(f"{LOOP};Scheduler.schedule ({SITE}/vllm/v1/core/sched/scheduler.py:300)", 70),
        # psgate's policy, leaf in psgate
        line(f"{LOOP};FreeKVCacheBlockQueue.popleft_n ({PSG}/engines/vllm_live.py:120)", 6),
        # stdlib called from psgate: psgate's
        line(f"{LOOP};EvictionLedger.eviction ({PSG}/vllm_plugin.py:199);"
             f"dumps ({STD}/json/__init__.py:231)", 3),
        # vLLM called from a psgate wrapper: vLLM's
        line(f"{LOOP};allocate_slots ({PSG}/vllm_plugin.py:330);"
             f"KVCacheManager.allocate_slots ({SITE}/vllm/v1/core/kv_cache_manager.py:250)", 20),
        # frozen importlib frames are the standard library's
        line(f"{LOOP};install ({PSG}/vllm_plugin.py:240);_find_and_load (<frozen "
             f"importlib._bootstrap>:1176)", 1),
        # a thread psgate started (the capture writer)
        line(f"{HEAD.replace('MainThread', 'psgate-capture')};Thread.run ({STD}/threading.py"
             f":982);CaptureWriter._drain ({PSG}/capture.py:90);write ({STD}/gzip.py:10)", 5),
        # psgate frames outside the busy loop and outside its own threads (API server)
        line(f'process 10:"vllm serve";thread (10): MainThread;main ({SITE}/vllm/cli.py:1);'
             f"register ({PSG}/vllm_plugin.py:90)", 2),
        # a stack with no frames counts as a sample only
        line('process 10:"vllm serve";thread (12): idle', 4),
        # waiting for the worker's output: part of the step
        line(f"{LOOP};MessageQueue.acquire_read ({SITE}/vllm/distributed/shm.py:400);"
             f"SpinCondition.wait ({SITE}/vllm/distributed/shm.py:90)", 40),
        # waiting for new requests: the loop is idle, not counted
        line(f"{LOOP};EngineCoreProc._process_input_queue ({SITE}/vllm/v1/engine/core.py:960);"
             f"Queue.get ({STD}/queue.py:171);Condition.wait ({STD}/threading.py:327)", 30),
        # the capture writer waiting out its poll interval: not work
        line(f"{HEAD.replace('MainThread', 'psgate-capture')};Thread.run ({STD}/threading.py"
             f":982);CaptureWriter._run ({PSG}/capture.py:140);Event.wait ({STD}/threading.py"
             f":622);Condition.wait ({STD}/threading.py:327)", 50),
    ])
    c = classifier.classify(raw)
    assert c["samples"] == 70 + 6 + 3 + 20 + 1 + 5 + 2 + 4 + 40 + 30 + 50
    assert c["loop"] == 70 + 6 + 3 + 20 + 1 + 40
    assert c["loop_idle"] == 30
    assert c["loop_psgate"] == 6 + 3 + 1
    assert c["psgate_threads"] == 5
    assert c["psgate_elsewhere"] == 2
    assert c["functions"] == {"engines/vllm_live.py:FreeKVCacheBlockQueue.popleft_n": 6,
                              "vllm_plugin.py:EvictionLedger.eviction": 3,
                              "vllm_plugin.py:install": 1,
                              "(threads) capture.py:CaptureWriter._drain": 5,
                              "(elsewhere) vllm_plugin.py:register": 2}


def test_site_packages_under_stdlib_is_not_stdlib(classifier):
    # A venv's site-packages may sit under the stdlib directory's path prefix.
    raw = line(f"{LOOP};wrapper ({PSG}/engines/vllm_live.py:1);"
               f"Tensor.numpy ({SITE}/torch/_tensor.py:5)", 9)
    c = classifier.classify(raw)
    assert (c["loop"], c["loop_psgate"]) == (9, 0)


def test_a_psgate_dir_prefix_is_not_psgate(classifier):
    raw = line(f"{LOOP};f (/src/psgate_other/x.py:1)", 4)
    assert classifier.classify(raw)["loop_psgate"] == 0


def test_overhead_pct():
    assert overhead_pct(10, 110) == pytest.approx(10.0)
    assert overhead_pct(0, 50) == 0.0
    assert overhead_pct(5, 5) is None
