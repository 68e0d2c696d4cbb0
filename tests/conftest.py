import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))


def pytest_addoption(parser):
    parser.addoption("--update-golden", action="store_true", default=False,
                     help="rewrite golden receipts from the current code instead of comparing")


# tests/vllm_suite imports vLLM: it runs in an interpreter that has it, started by
# tests/test_vllm.py with PSGATE_VLLM_SUITE=1 (never collected by the plain test run).
collect_ignore = [] if os.environ.get("PSGATE_VLLM_SUITE") == "1" else ["vllm_suite"]


def pytest_configure(config):
    config.addinivalue_line("markers", "shared: an extra check over ../shared/traces (the "
                            "public traces beside the repository): skipped with the reason "
                            "where absent, required under PSGATE_REQUIRE_SHARED=1")
    config.addinivalue_line("markers", "heavy: runs in a heavy interpreter (vLLM, torch): "
                            "skipped with the install command where absent, required under "
                            "PSGATE_REQUIRE_VLLM=1 / PSGATE_REQUIRE_CALIBRATE=1")


def pytest_runtest_setup(item):
    if item.get_closest_marker("shared") is not None:
        from helpers import shared_traces
        shared_traces()     # skips (or, under PSGATE_REQUIRE_SHARED=1, fails) when absent
