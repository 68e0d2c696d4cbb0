"""Builds psgate's compiled modules beside the pure-Python package: the core
(psgate/_core.pyx) and the modules written in Cython's pure-Python mode (COMPILED_PY), each
of which is its own source: compiled here, and run as Python where it is not.

Everything else is declared in pyproject.toml. The core is optional: where Cython or a
C compiler is missing, or the build fails, the package installs without it and every
replay runs on the Python reference code (psgate.core says so in one line).
"""

from setuptools import setup
from setuptools.command.build_ext import build_ext


class OptionalBuildExt(build_ext):
    """build_ext that reports a failed compile and goes on without the extension."""

    def run(self):
        try:
            super().run()
        except Exception as exc:  # noqa: BLE001 - any failure means: no compiled core
            self.warn(f"psgate: the compiled core was not built ({exc}); "
                      "the Python engine will replay")

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except Exception as exc:  # noqa: BLE001
            self.warn(f"psgate: the compiled core was not built ({exc}); "
                      "the Python engine will replay")


# Modules in Cython's pure-Python mode (a .pxd beside each gives its C types). The core
# cimports them: where one of them did not build, the core does not load either, and the
# whole replay runs as Python.
COMPILED_PY = ["psgate/engines/pool_work.py", "psgate/engines/step_work.py",
               "psgate/invariants/checker.py",
               "psgate/invariants/prefixshield.py",
               "psgate/policy/field_decision.py", "psgate/policy/history.py",
               "psgate/policy/buckets.py", "psgate/policy/debt_ranking.py",
               "psgate/policy/leaf_tracker.py",
               "psgate/policy/seq_queues.py",
               "psgate/policies/lru.py", "psgate/receipt/field_code.py",
               "psgate/receipt/row_text.py",
               "psgate/trace/hashes.py"]


def extensions():
    try:
        from Cython.Build import cythonize
    except ImportError:
        print("psgate: Cython is not available; building without the compiled core")
        return []
    # A module in pure-Python mode keeps Python's indexing (bounds checked, a negative
    # index from the end): what its Python code indexes beyond a list raises as the
    # interpreted module would. Its loops read the flat arrays through psgate.flat's
    # pointers, which are not checked: a loop indexes them with block ids it has checked
    # (the checker's) or that come from the engine's own lists (lru's walks).
    return (cythonize(COMPILED_PY, language_level=3, quiet=True)
            + cythonize(["psgate/_core.pyx"], language_level=3, quiet=True,
                        compiler_directives={"boundscheck": False, "wraparound": False,
                                             "initializedcheck": False}))


setup(ext_modules=extensions(), cmdclass={"build_ext": OptionalBuildExt})
