"""The import layering of psgate's packages, read from the source with ``ast``.

A room is a package under psgate/ or a top-level module. Each may import only the rooms
its row names (imports inside functions count: a lazy import is still a dependency).
Bottom up: errors, inputs (files that must be regular), contracts, resources, atomic,
core (which of the replay's loops are compiled) and cython_shadow need nothing,
invariants only core; trace reads and writes traces (with core's compiled hash checks); policy is the public
policy API (the interface, its helpers, the contract table and the I1/I2 auditor);
policies, the built-in ones, see that API alone, never an engine (their registry asks core for
a compiled policy module's source file); engines run policies
through the interface and the registry, never a
concrete policy or a family's checker (the policy hands those over), and never the receipt,
the reports or the CLI; stats, workloads and the receipt see of the engines only their
results, the cost models and the registry; the receipt also holds the metrics; api,
experiment and sweep put a replay together; suggest sizes contracts from a replayed
history; report reads receipts back and may re-run
them; check runs the policy contract (psgate check-policy) over the engines and the api,
and no room below the CLI uses it; the CLI may use anything.
A second rule: no module imports a ``_``-name from another psgate module.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import psgate

ROOT = Path(psgate.__file__).resolve().parent
BASE = {"psgate", "errors", "inputs", "cython_shadow", "flat"}   # the package itself (its
# version), the error types, the reading of an input that must be a regular file, Cython's
# pure-Python names for a compiled module interpreted without Cython, and a flat array's
# items for a loop compiled from Python

ALLOWED: dict[str, set[str] | None] = {
    "errors": set(),
    "inputs": set(),
    "contracts": set(),
    "resources": set(),
    "atomic": set(),
    "core": set(),
    "cython_shadow": set(),      # Cython's pure-Python names, where Cython is not installed
    "flat": set(),               # a flat array's items, for loops compiled from Python
    "executors": set(),          # where independent jobs run: local processes or Ray
    "invariants": {"core"},
    "trace": {"resources", "atomic", "contracts", "core"},
    "policy": {"contracts", "core", "invariants"},
    "policies": {"policy", "core"},   # the registry: a compiled policy's source file
    "engines": {"core", "resources", "trace", "invariants", "policy", "policies"},
    "stats": {"engines"},
    "receipt": {"atomic", "core", "resources", "trace", "engines", "stats"},
    "workloads": {"contracts", "trace", "engines"},
    "calibrate": {"atomic", "engines", "workloads"},
    "capture": {"trace"},
    "shadow": {"engines", "policy", "policies", "trace"},
    "vllm_plugin": {"capture", "contracts", "engines", "policies", "shadow", "trace"},
    "api": {"atomic", "contracts", "engines", "invariants", "policies", "receipt",
            "resources", "stats", "trace"},
    "experiment": {"api", "atomic", "engines", "receipt", "resources", "stats", "trace",
                   "workloads"},
    "sweep": {"api", "atomic", "contracts", "engines", "executors", "experiment", "policies",
              "receipt", "trace", "workloads"},
    # capacity curves: lru's one pass over the trace, other points by api.replay
    "curve": {"api", "engines", "executors", "policies", "trace"},
    "bench": {"api", "atomic", "contracts", "core", "engines", "policies", "receipt", "resources",
              "stats", "trace", "workloads"},
    "report": {"api", "engines", "experiment", "policies", "receipt", "resources", "stats",
               "trace"},
    # check-policy's contract: replays (in process and through the api), the trace
    # generators, the policy API and the invariant checker's constants
    "check": {"api", "engines", "invariants", "policies", "policy", "receipt", "trace",
              "workloads"},
    # contracts from data: the history replayed under lru, its creations read as buckets
    "suggest": {"contracts", "engines", "policies", "stats", "trace"},
    "cli": None,                 # anything
    "__main__": {"cli"},
}
# Where a room may reach into another only through some of its modules.
ONLY: dict[tuple[str, str], set[str]] = {
    ("engines", "policies"): {"psgate.policies", "psgate.policy.base"},
    ("engines", "invariants"): {"psgate.invariants.checker"},
    ("stats", "engines"): {"psgate.engines.cost", "psgate.engines.results"},
    ("receipt", "engines"): {"psgate.engines", "psgate.engines.results"},
    ("workloads", "engines"): {"psgate.engines.cost", "psgate.engines.step_cost"},
    ("calibrate", "engines"): {"psgate.engines.cost", "psgate.engines.step_cost"},
}


def _modules():
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        parts = ("psgate",) + rel.parts
        is_pkg = parts[-1] == "__init__"
        if is_pkg:
            parts = parts[:-1]
        yield ".".join(parts), is_pkg, ast.parse(path.read_text(encoding="utf-8"), str(path))


def _scripts():
    """The tools and examples beside the package, which use it as any caller would."""
    for folder in ("tools", "examples"):
        for path in sorted((ROOT.parent / folder).rglob("*.py")):
            name = str(path.relative_to(ROOT.parent))
            yield name, False, ast.parse(path.read_text(encoding="utf-8"), name)


def _is_module(name: str) -> bool:
    path = ROOT.joinpath(*name.split(".")[1:])
    return path.is_dir() or path.with_suffix(".py").is_file()


def _base(package: str, node: ast.ImportFrom) -> str:
    """The absolute module a ``from ... import`` reads from."""
    if not node.level:
        return node.module or ""
    up = package.split(".")[:len(package.split(".")) - node.level + 1]
    return ".".join(up + ([node.module] if node.module else []))


def _psgate(name: str) -> bool:
    return name == "psgate" or name.startswith("psgate.")


def _imports(module: str, is_pkg: bool, tree: ast.AST):
    """(line, imported psgate module, names taken from it, local names bound to modules)."""
    package = module if is_pkg else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if _psgate(a.name):
                    local = {a.asname: a.name} if a.asname else {}
                    yield node.lineno, a.name, (), local
        elif isinstance(node, ast.ImportFrom):
            base = _base(package, node)
            if not _psgate(base):
                continue
            for a in node.names:
                sub = f"{base}.{a.name}"
                if _is_module(sub):     # "from psgate import api": the module itself
                    yield node.lineno, sub, (), {a.asname or a.name: sub}
                else:
                    yield node.lineno, base, (a.name,), {}


def _room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "psgate"


def test_every_package_imports_only_the_rooms_below_it():
    bad = []
    for module, is_pkg, tree in _modules():
        room = _room(module)
        if room == "psgate":
            continue
        if room not in ALLOWED:
            bad.append(f"{module}: room '{room}' has no row in ALLOWED")
            continue
        allowed = ALLOWED[room]
        for line, target, _, _ in _imports(module, is_pkg, tree):
            other = _room(target)
            if other == room or other in BASE or allowed is None:
                continue
            if other not in allowed:
                bad.append(f"{module}:{line} imports {target} ({room} may not use {other})")
            elif (room, other) in ONLY and target not in ONLY[(room, other)]:
                bad.append(f"{module}:{line} imports {target} ({room} may use {other} only "
                           f"through {', '.join(sorted(ONLY[(room, other)]))})")
    assert not bad, "\n".join(bad)


def test_built_in_policies_use_only_the_public_policy_api():
    """Each built-in policy is written as a user's policy is: against ``psgate.policy``
    (the module itself, not its submodules) and, for one that extends another, that
    built-in policy's module; the registry beside them is not theirs to use. One written
    in Cython's pure-Python mode may take Cython's names from ``psgate.cython_shadow``
    where Cython is not installed, and its arrays' items from ``psgate.flat``."""
    bad = []
    for module, is_pkg, tree in _modules():
        if not module.startswith("psgate.policies.") or is_pkg:
            continue
        for line, target, _, _ in _imports(module, is_pkg, tree):
            if target in ("psgate.policy", "psgate.cython_shadow", "psgate.flat"):
                continue
            if target.startswith("psgate.policies.") and target.count(".") == 2:
                continue
            bad.append(f"{module}:{line} imports {target}")
    assert not bad, "\n".join(bad)


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def test_no_module_imports_a_private_name_of_another():
    """Neither ``from psgate.x import _y`` nor ``x._y`` on an imported psgate module, in
    the package or in the tools and examples beside it."""
    bad = []
    for module, is_pkg, tree in [*_modules(), *_scripts()]:
        aliases: dict[str, str] = {}
        for line, target, names, local in _imports(module, is_pkg, tree):
            bad += [f"{module}:{line} imports {n} from {target}" for n in names
                    if _private(n) and target != module]
            aliases.update(local)
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and _private(node.attr) and aliases.get(node.value.id, module) != module):
                bad.append(f"{module}:{node.lineno} uses {node.attr} of "
                           f"{aliases[node.value.id]}")
    assert not bad, "\n".join(bad)


def _classes() -> dict[str, tuple[str, list[str], set[str]]]:
    """Every psgate class: its module, its base classes' names and the ``_``-names it
    defines (methods, and attributes it assigns on ``self``)."""
    out = {}
    for module, _, tree in _modules():
        for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
            names = {n.name for n in cls.body if isinstance(n, ast.FunctionDef)}
            for node in ast.walk(cls):
                if (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
                        and isinstance(node.value, ast.Name) and node.value.id == "self"):
                    names.add(node.attr)
            bases = [b.id if isinstance(b, ast.Name) else getattr(b, "attr", "")
                     for b in cls.bases]
            out[cls.name] = (module, bases, {n for n in names if _private(n)})
    return out


def test_no_subclass_uses_a_private_name_of_a_class_in_another_module():
    """A class built on a class of another module (an engine on the shared bookkeeping, a
    policy on another policy) calls, reads or overrides only its public interface: a
    ``self._x`` it touches is its own or its module's."""
    classes = _classes()

    def inherited(name: str, module: str) -> set[str]:
        found: set[str] = set()
        for base in classes.get(name, ("", [], set()))[1]:
            if base in classes:
                base_module, _, names = classes[base]
                if base_module != module:
                    found |= names
                found |= inherited(base, module)
        return found

    bad = []
    for module, _, tree in _modules():
        for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
            foreign = inherited(cls.name, module)
            if not foreign:
                continue
            for node in ast.walk(cls):
                name = (node.attr if isinstance(node, ast.Attribute)
                        and isinstance(node.value, ast.Name) and node.value.id == "self"
                        else node.name if isinstance(node, ast.FunctionDef) else None)
                if name in foreign:
                    bad.append(f"{module}:{node.lineno} {cls.name} touches {name} of a base "
                               f"class in another module")
    assert not bad, "\n".join(sorted(set(bad)))


def _compiled_private_reads() -> set[str]:
    """``x._y`` in the compiled sources (``.pyx``, ``.pxd``) where ``_y`` is a private name
    a psgate Python class defines and ``x`` is neither ``self`` nor a variable typed as
    one of the compiled sources' own classes. Docstrings and comments do not count."""
    python_private = set().union(*(names for _, _, names in _classes().values()))
    found = set()
    for path in sorted([*ROOT.rglob("*.pyx"), *ROOT.rglob("*.pxd")]):
        text = re.sub(r'"""[\s\S]*?"""', "", path.read_text(encoding="utf-8"))
        text = re.sub(r"#[^\n\"]*", "", text)
        own = set(re.findall(r"^cdef class (\w+)", text, re.M))
        typed = {"self"}
        for cls in own:
            for m in re.finditer(rf"\b{cls}\s+((?:\w+\s*(?:=\s*[^,\n]+)?,\s*)*\w+)", text):
                typed |= {v.split("=")[0].strip() for v in m.group(1).split(",")}
        for m in re.finditer(r"\b([a-z_][a-z0-9_]*)\.(_[a-z][a-z0-9_]*)\b", text):
            if m.group(1) not in typed and m.group(2) in python_private:
                found.add(m.group(0))
    return found


def test_compiled_sources_read_no_private_name_of_a_python_module():
    """A rename in Python must not break only where a compiled replay runs: the compiled
    sources use what a Python module makes public, as every other module does."""
    found = _compiled_private_reads()
    assert not found, f"private names read by compiled code: {sorted(found)}"
