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
