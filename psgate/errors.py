"""Errors that end a command, each carrying the exit code the CLI returns.

Exit codes: 0 the gate passed, 1 the gate failed, 2 bad input or usage (an output the file
system refuses and memory exhausted included: one line either way, never a traceback),
3 an engine that is not installed or cannot start, 4 an internal error (a psgate bug: one
line saying so and where the traceback is, never 1, which CI reads as a policy regression),
5 (``psgate verify``) the receipt's policy code is not the code found here, 130 and 143
interrupted by SIGINT and SIGTERM (128 + the signal, as a shell reports it).
"""

EXIT_PASS = 0
EXIT_GATE_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_ENGINE_UNAVAILABLE = 3
EXIT_INTERNAL = 4
EXIT_POLICY_CHANGED = 5
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143


class PsgateError(Exception):
    """A failure that the CLI reports as one line and an exit code."""

    exit_code = EXIT_BAD_INPUT


class InputError(PsgateError):
    """Bad input: a malformed trace, gate file or option.

    The message names where the problem is (``file:line: field ...``) and what
    was expected, so an operator can fix it without reading a traceback.
    """

    def __init__(self, message: str, *, path: str | None = None, line: int | None = None,
                 field: str | None = None):
        where = ""
        if path is not None:
            where = f"{path}:{line}: " if line is not None else f"{path}: "
        what = f"field '{field}': " if field else ""
        super().__init__(f"{where}{what}{message}")
        self.path = path
        self.line = line
        self.field = field


class EngineUnavailable(PsgateError):
    exit_code = EXIT_ENGINE_UNAVAILABLE
