"""The compiled core, or None: which replay code runs.

``psgate/_core.pyx`` (Cython, built by ``pip install``) holds compiled forms of the
replay's inner loops: the invariant checker's, the block pool's (an allocation batch and
its checks), the step scheduler's pass over running requests and its allocate_slots,
lru's queue walks, prefixshield's victim choice and bookkeeping (``PrefixShieldView``,
over the policy's own state), the admission history, the ledger's eviction rows and the
compact ledger's coder (``CompactCoder``). Each loop's Python form stays where it was,
as the readable reference, and runs wherever the core is absent or switched off; a
differential test (tests/test_core_differential.py) holds both to byte-identical
receipts and ledgers. A compiled loop takes the common case only and hands anything
unusual (a violation, a key outside the flat tables) back to the Python form at the
point where it stopped, so the two can only differ in speed.

Modules written in Cython's pure-Python mode (``psgate/engines/step_work.py``) are their
own single source: compiled at install where a compiler is, interpreted elsewhere, whatever
``PSGATE_CORE`` says (docs/compiled-code.md).

``PSGATE_CORE=0`` switches the core off; a missing core is said once, in one line on
stderr, the first time a replay asks for it.
"""

from __future__ import annotations

import importlib
import os
import sys

_state: dict = {}


def _load():
    """The module, imported once (None where it is not built; the error is kept)."""
    if "mod" not in _state:
        try:
            _state["mod"] = importlib.import_module("psgate._core")
        except ImportError as exc:
            _state["mod"] = None
            _state["error"] = exc
    return _state["mod"]


def get():
    """The ``psgate._core`` module, or None (switched off, or not built here)."""
    if os.environ.get("PSGATE_CORE", "1") == "0":
        return None
    mod = _load()
    if mod is None and not _state.get("said"):
        _state["said"] = True
        sys.stderr.write(f"psgate: note: the compiled core is not built here "
                         f"({_state['error']}); replaying with the Python engine (same "
                         f"results, slower)\n")
    return mod


def quiet():
    """get() for code that also runs outside replays (reading a trace): the module or
    None, and no notice where it is missing (the replay that asks for it says it)."""
    if os.environ.get("PSGATE_CORE", "1") == "0":
        return None
    return _load()


def describe() -> str:
    """'compiled' or 'python', for the bench's and the receipt's environment notes."""
    return "python" if get() is None else "compiled"
