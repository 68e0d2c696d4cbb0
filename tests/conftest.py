import os
import sys
from pathlib import Path

# Tests are laid out like the package (tests/<package>/test_<module>.py, tests/system/ end
# to end, tests/vllm_suite/ the heavy suite); their shared helpers sit here, and a test may
# import another's fixtures by module name, so every folder is on the path.
_HERE = Path(__file__).parent
sys.path.insert(0, str(_HERE))
sys.path[1:1] = [str(d) for d in sorted(_HERE.iterdir())
                 if d.is_dir() and d.name not in ("data", "vllm_suite") and not d.name.startswith(
                     (".", "_"))]


def pytest_addoption(parser):
    parser.addoption("--update-golden", action="store_true", default=False,
                     help="rewrite golden receipts from the current code instead of comparing")


# tests/vllm_suite imports vLLM: it runs in an interpreter that has it, started by
# tests/engines/test_vllm.py with PSGATE_VLLM_SUITE=1 (never collected by the plain run).
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
