"""Which replay code runs: compiled where the install could compile, or Python.

Two kinds of compiled code serve a replay:
- ``psgate/_core.pyx`` (Cython) holds compiled forms of loops whose Python form stays in
  its module as the readable reference: prefixshield's victim choice and bookkeeping
  (``PrefixShieldView``, over the policy's own state) and the compact ledger's coder of
  eviction batches from their fields (``CompactCoder``). A differential test (tests/test_core_differential.py)
  holds both forms to byte-identical receipts and ledgers. A compiled loop takes the
  common case only and hands anything unusual (a violation, a key outside the flat
  tables) back to the Python form at the point where it stopped.
- Modules written in Cython's pure-Python mode (``psgate/engines/pool_work.py``,
  ``psgate/engines/step_work.py``, ``psgate/invariants/checker.py``,
  ``psgate/policies/lru.py``, ``psgate/trace/hashes.py``, ``psgate/policy/history.py``,
  ``psgate/receipt/row_text.py``, ``psgate/receipt/field_code.py``, ...) are their own
  single source: compiled at install where a compiler is, interpreted elsewhere
  (docs/compiled-code.md).

``PSGATE_CORE=0`` switches the core off. Set when psgate is first imported, it also
loads every pure-Python-mode module from its ``.py`` source (:func:`run_interpreted`):
the replay is then what an install without a C compiler runs, which is what the bench's
``core_vs_python`` compares against. A missing core is said once, in one line on stderr,
the first time a replay asks for it.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
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


def source_file(path: str) -> str:
    """A module's source file: for one compiled from Python (Cython's pure-Python mode,
    ``lru.cpython-311-x86_64-linux-gnu.so``), the ``.py`` beside it, which is its code and
    which its frames name; any other path as it is."""
    folder, _, file = path.rpartition(os.sep)
    if file.endswith((".so", ".pyd")):
        source = os.path.join(folder, file.split(".")[0] + ".py")
        if os.path.isfile(source):
            return source
    return path


class _Interpreted(importlib.abc.MetaPathFinder):
    """Finds psgate's compiled modules as the interpreter would without them: a module
    compiled from Python loads from the ``.py`` beside it, the core not at all."""

    def find_spec(self, name, path, target=None):
        if not name.startswith("psgate."):
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or not spec.origin or spec.origin.endswith(".py"):
            return spec
        if name == "psgate._core":          # no Python form of its own: the references run
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        source = source_file(spec.origin)
        if source == spec.origin:
            return spec
        return importlib.util.spec_from_file_location(name, source)


def run_interpreted() -> bool:
    """Where ``PSGATE_CORE=0``, every psgate module imported from now on loads from its
    Python source (called as psgate is imported, before any of its modules). Whether it
    did; a module imported before this stays as it was."""
    if os.environ.get("PSGATE_CORE", "1") != "0":
        return False
    if not any(type(f) is _Interpreted for f in sys.meta_path):
        sys.meta_path.insert(0, _Interpreted())
    return True


def interpreted() -> bool:
    """Whether this interpreter loads psgate's modules from their Python sources."""
    return any(type(f) is _Interpreted for f in sys.meta_path)


def describe() -> str:
    """'compiled' or 'python', for the bench's and the receipt's environment notes."""
    return "python" if get() is None else "compiled"
