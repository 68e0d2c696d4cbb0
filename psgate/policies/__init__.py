"""The policies psgate ships, and how a policy is named: the registry and policy specs.

One module per built-in policy, each written against the public API (:mod:`psgate.policy`)
and nothing else of psgate; a module's policies are the :class:`EvictionPolicy`
subclasses it defines with a ``name``. Wherever a command takes a policy it takes a
*spec*:

    lru                          a built-in policy, else an installed package's entry point
                                 of that name in the group ``psgate.policies``
    my_pkg.policies:QuotaLRU     a class in an importable module
    path/to/quota.py:QuotaLRU    a class in a Python file (imported under a private name)

A plain name finds the built-in policy first: an entry point with a built-in's name is
reachable only by its ``module:Class`` (``psgate policies`` shows it as shadowed).
Resolving a spec checks the class (a policy subclass, concrete, with a name and a policy
API version this psgate provides) and describes its code (:class:`PolicySource`): where it
came from and a SHA-256 over its source files, which the receipt records and ``verify``
compares. Every failure is one line naming the spec and what was expected (exit 2).
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.util
import inspect
import pkgutil
import sys
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from psgate import core
from psgate.errors import InputError
from psgate.policy import API_VERSION, EvictionPolicy

ENTRY_POINT_GROUP = "psgate.policies"
BUILTIN, ENTRY_POINT, MODULE, FILE = "builtin", "entry-point", "module", "file"
_FILE_MODULE_PREFIX = "psgate_policy_file_"

_REGISTRY: dict[str, type] = {}
_loaded: list[bool] = []


def register(cls):
    """Add a policy class under its name at run time (a test's stand-in); a built-in
    module's classes are found without it."""
    if not cls.name or cls.name in _REGISTRY:
        raise ValueError(f"policy name missing or taken: {cls.name!r}")
    _REGISTRY[cls.name] = cls
    return cls


def unregister(name: str) -> None:
    """Forget a policy registered at run time, freeing its name."""
    del _REGISTRY[name]


def _is_policy_class(obj) -> bool:
    return inspect.isclass(obj) and issubclass(obj, EvictionPolicy) and obj is not EvictionPolicy


def _load_builtin() -> None:
    """Import every module of this package and take the policies each defines."""
    if _loaded:
        return
    _loaded.append(True)
    for mod in sorted(m.name for m in pkgutil.iter_modules(__path__)):
        module = importlib.import_module(f"{__name__}.{mod}")
        for obj in vars(module).values():
            if _is_policy_class(obj) and obj.__module__ == module.__name__ and obj.name:
                register(obj)


def policy_names() -> list[str]:
    """The built-in policies' names (and any registered at run time)."""
    _load_builtin()
    return sorted(_REGISTRY)


# -- specs -----------------------------------------------------------------------------
@dataclass(frozen=True)
class PolicySource:
    """Where a policy class came from and which code it is.

    ``sha256`` is over the source files of every module that defines a class in the
    policy's MRO, outside the policy API itself: for a module of an installed or
    importable package, every ``.py`` file of its top-level package (a helper module
    the policy imports is code it runs); for a file spec, the file; for a built-in,
    its module and those of the built-in classes it extends. ``files`` names them (a
    file spec's path as given, others relative to their package's parent)."""

    spec: str
    kind: str
    cls: type
    module: str
    qualname: str
    file: str | None = None
    entry_point: str | None = None
    distribution: str | None = None
    version: str | None = None
    files: tuple[str, ...] = ()
    paths: tuple[str, ...] = ()
    sha256: str = ""
    notes: tuple[str, ...] = field(default=())

    @property
    def class_name(self) -> str:
        """``module:Class``, or ``file.py:Class`` for a file (its module name is private)."""
        return f"{self.file if self.kind == FILE else self.module}:{self.qualname}"

    def to_json(self) -> dict:
        """The receipt's record (deterministic: no absolute path, no time)."""
        out: dict[str, Any] = {"kind": self.kind, "spec": self.spec,
                               "class": self.class_name}
        if self.file is not None:
            out["file"] = self.file
        if self.entry_point is not None:
            out["entry_point"] = self.entry_point
        if self.distribution is not None:
            out["distribution"] = self.distribution
            out["version"] = self.version
        out["api_version"] = self.cls.api_version
        out["sha256"] = self.sha256
        out["files"] = list(self.files)
        return out


def _fail(spec: str, where: str | None, message: str) -> InputError:
    return InputError(f"policy '{spec}': {message}", path=where)


def _code_error(spec: str, where: str | None, exc: BaseException,
                doing: str = "importing it") -> InputError:
    """The user's code failed: one line with the exception and where it was raised."""
    if isinstance(exc, SyntaxError):
        loc = f"{exc.filename}:{exc.lineno}: " if exc.filename else ""
        return _fail(spec, where, f"{loc}syntax error: {exc.msg}")
    tb = exc.__traceback__
    last = None
    while tb is not None:
        last = tb
        tb = tb.tb_next
    loc = (f" at {last.tb_frame.f_code.co_filename}:{last.tb_lineno}"
           if last is not None else "")
    return _fail(spec, where, f"{doing} raised {type(exc).__name__}: {exc}{loc}")


def _import_module(spec: str, module: str, where: str | None):
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name and (module == exc.name or module.startswith(exc.name + ".")):
            raise _fail(spec, where, f"no module named '{exc.name}' in this interpreter "
                        f"({sys.executable}); install its package, or name the file as "
                        f"path/to/file.py:Class") from None
        raise _code_error(spec, where, exc) from None
    except Exception as exc:   # noqa: BLE001 - the user's module: any error is theirs
        raise _code_error(spec, where, exc) from None


def _import_file(spec: str, path_text: str, where: str | None):
    path = Path(path_text)
    if not path.is_file():
        raise _fail(spec, where, f"no such file '{path_text}'")
    resolved = path.resolve()
    # One module per path and content: a file edited within one process is its new code.
    digest = hashlib.sha256(str(resolved).encode() + b"\0" + resolved.read_bytes())
    name = _FILE_MODULE_PREFIX + digest.hexdigest()[:16]
    if name in sys.modules:
        return sys.modules[name]
    loader_spec = importlib.util.spec_from_file_location(name, resolved)
    if loader_spec is None or loader_spec.loader is None:
        raise _fail(spec, where, f"'{path_text}' cannot be imported as a Python file")
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[name] = module         # dataclasses and pickling look the module up
    try:
        loader_spec.loader.exec_module(module)
    except Exception as exc:   # noqa: BLE001 - the user's file: any error is theirs
        del sys.modules[name]
        raise _code_error(spec, where, exc) from None
    return module


def _attribute(spec: str, module, qualname: str, where: str | None, shown: str):
    obj = module
    for part in qualname.split("."):
        if not hasattr(obj, part):
            found = sorted(n for n, v in vars(module).items()
                           if _is_policy_class(v) and v.__module__ == module.__name__)
            raise _fail(spec, where, f"{shown} has no attribute '{qualname}'; policy classes "
                        f"defined there: {', '.join(found) or 'none'}")
        obj = getattr(obj, part)
    return obj


def check_class(spec: str, obj, where: str | None = None) -> type:
    """``obj`` as a usable policy class, or a one-line error saying what it lacks."""
    if not _is_policy_class(obj):
        what = type(obj).__name__ if not inspect.isclass(obj) else f"class {obj.__name__}"
        raise _fail(spec, where, f"expected a subclass of psgate.policy.EvictionPolicy, "
                    f"found {what}")
    if getattr(obj, "__abstractmethods__", None):
        raise _fail(spec, where, f"{obj.__name__} does not implement "
                    f"{', '.join(sorted(obj.__abstractmethods__))}")
    if not isinstance(obj.name, str) or not obj.name:
        raise _fail(spec, where, f"{obj.__name__} declares no name; set the class attribute "
                    f"name = \"...\" (how receipts and ledgers call it)")
    version = obj.api_version
    if type(version) is not int or version < 1:
        raise _fail(spec, where, f"{obj.__name__} declares no policy API version; set the "
                    f"class attribute api_version = {API_VERSION}")
    if version > API_VERSION:
        from psgate import __version__
        raise _fail(spec, where, f"{obj.__name__} is written for policy API version "
                    f"{version}, and this psgate ({__version__}) provides version "
                    f"{API_VERSION}; upgrade psgate")
    if not isinstance(obj.defaults, dict):
        raise _fail(spec, where, f"{obj.__name__}.defaults: expected a dict of parameters "
                    f"and their defaults, found {type(obj.defaults).__name__}")
    return obj


def _entry_points(name: str | None = None) -> list:
    eps = metadata.entry_points(group=ENTRY_POINT_GROUP)
    found = [ep for ep in eps if name is None or ep.name == name]
    return sorted(found, key=lambda ep: (ep.name, ep.value))


def _is_file_spec(target: str) -> bool:
    return target.endswith(".py") or "/" in target or "\\" in target


def _split(spec: str, where: str | None) -> tuple[str, str] | None:
    """(target, qualname) of a qualified spec, or None for a plain name."""
    if ":" not in spec:
        return None
    target, _, qualname = spec.rpartition(":")
    if not target or not qualname or not all(p.isidentifier() for p in qualname.split(".")):
        raise _fail(spec, where, "expected NAME, module:Class or path/to/file.py:Class")
    if not _is_file_spec(target) and not all(p.isidentifier() for p in target.split(".")):
        raise _fail(spec, where, f"'{target}' is neither a module name nor a .py file")
    return target, qualname


def resolve(spec: str, where: str | None = None) -> PolicySource:
    """The class a spec names, checked, with its source described. ``where`` (an option
    or a field) prefixes every error."""
    if not isinstance(spec, str) or not spec:
        raise _fail(str(spec), where, "expected NAME, module:Class or path/to/file.py:Class")
    _load_builtin()
    parts = _split(spec, where)
    if parts is None:
        if spec in _REGISTRY:
            cls = _REGISTRY[spec]
            notes = tuple(f"the entry point '{ep.name}' ({ep.value}) is shadowed by the "
                          f"built-in policy of that name; name it as {ep.value} to use it"
                          for ep in _entry_points(spec))
            return _describe(spec, BUILTIN, cls, notes=notes)
        eps = _entry_points(spec)
        if not eps:
            installed = [ep.name for ep in _entry_points()]
            raise _fail(spec, where, f"no such policy; built-in: {', '.join(sorted(_REGISTRY))}"
                        + (f"; installed: {', '.join(installed)}" if installed else "")
                        + "; or name a class as module:Class or path/to/file.py:Class")
        if len(eps) > 1:
            raise _fail(spec, where, "several installed packages register this name ("
                        + ", ".join(f"{ep.value} from {_dist_name(ep)}" for ep in eps)
                        + "); name one as module:Class")
        ep = eps[0]
        target, _, qualname = ep.value.partition(":")
        module = _import_module(spec, target.strip(), where)
        cls = check_class(spec, _attribute(spec, module, qualname.strip(), where,
                                           f"module '{target.strip()}'"), where)
        if cls.name != ep.name:
            raise _fail(spec, where, f"the entry point '{ep.name}' names {ep.value}, whose "
                        f"name is '{cls.name}'; the two must agree")
        dist = ep.dist
        return _describe(spec, ENTRY_POINT, cls, entry_point=ep.name,
                         distribution=dist.metadata["Name"] if dist else None,
                         version=dist.version if dist else None)
    target, qualname = parts
    if _is_file_spec(target):
        module = _import_file(spec, target, where)
        cls = check_class(spec, _attribute(spec, module, qualname, where, f"'{target}'"),
                          where)
        return _describe(spec, FILE, cls, file=target)
    module = _import_module(spec, target, where)
    cls = check_class(spec, _attribute(spec, module, qualname, where, f"module '{target}'"),
                      where)
    kind = BUILTIN if cls.__module__.startswith(__name__ + ".") else MODULE
    dist = _distribution_of(cls.__module__)
    return _describe(spec, kind, cls, distribution=dist[0] if dist else None,
                     version=dist[1] if dist else None)


def _dist_name(ep) -> str:
    return ep.dist.metadata["Name"] if ep.dist else "an unknown distribution"


@functools.lru_cache(maxsize=None)
def _distribution_of(module: str) -> tuple[str, str] | None:
    """The installed distribution providing ``module``'s top-level package, if exactly one
    does (scanning every distribution once per process is the slow part of a resolve)."""
    top = module.split(".")[0]
    names = metadata.packages_distributions().get(top) or []
    if len(names) != 1:
        return None
    try:
        return names[0], metadata.version(names[0])
    except metadata.PackageNotFoundError:
        return None


def _policy_modules(cls: type):
    """(klass, module name, file) for each class of the MRO with a file of its own, outside
    the policy API (whose code psgate's version and ``api_version`` name) and Python's
    own ``object`` and ``ABC``."""
    for klass in cls.__mro__:
        mod_name = klass.__module__
        if mod_name in ("builtins", "abc") or mod_name == "psgate.policy" or \
                mod_name.startswith("psgate.policy."):
            continue
        path = getattr(sys.modules.get(mod_name), "__file__", None)
        if path is not None:
            yield klass, mod_name, core.source_file(path)   # compiled: its .py


def policy_code_files(cls: type, builtin: bool = True) -> set[str]:
    """The files of a policy class's own code, as the interpreter names them in frames;
    ``builtin=False`` leaves out psgate's own modules (a built-in policy it extends)."""
    return {path for _, mod_name, path in _policy_modules(cls)
            if builtin or not (mod_name == "psgate" or mod_name.startswith("psgate."))}


def innermost_frame(tb, files: set[str]):
    """The innermost traceback entry whose code is in ``files``, or None."""
    hit = None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename in files:
            hit = tb
        tb = tb.tb_next
    return hit


def _source_files(cls: type, spec_file: str | None) -> list[tuple[str, Path]]:
    """(label, path) of every file whose code the class runs, as PolicySource says."""
    out: dict[str, Path] = {}
    for klass, mod_name, path in _policy_modules(cls):
        path = Path(path).resolve()
        if mod_name.startswith(_FILE_MODULE_PREFIX):
            out[spec_file if klass is cls and spec_file else path.name] = path
        elif mod_name.startswith("psgate."):
            out[f"psgate/{'/'.join(mod_name.split('.')[1:])}.py"] = path
        else:
            top = sys.modules.get(mod_name.split(".")[0])
            top_paths = list(getattr(top, "__path__", None) or [])
            if len(top_paths) == 1:
                root = Path(top_paths[0]).resolve()
                for p in sorted(root.rglob("*.py")):
                    if "__pycache__" not in p.parts:
                        out[p.relative_to(root.parent).as_posix()] = p
            else:
                out[path.name] = path
    return sorted(out.items())


def _describe(spec: str, kind: str, cls: type, file: str | None = None,
              entry_point: str | None = None, distribution: str | None = None,
              version: str | None = None, notes: tuple[str, ...] = ()) -> PolicySource:
    files = _source_files(cls, file)
    lines = []
    for label, path in files:
        lines.append(f"{hashlib.sha256(path.read_bytes()).hexdigest()}  {label}\n")
    if kind == BUILTIN and distribution is None:
        from psgate import __version__
        distribution, version = "psgate", __version__
    return PolicySource(spec=spec, kind=kind, cls=cls, module=cls.__module__,
                        qualname=cls.__qualname__, file=file, entry_point=entry_point,
                        distribution=distribution, version=version,
                        files=tuple(label for label, _ in files),
                        paths=tuple(str(p) for _, p in files),
                        sha256=hashlib.sha256("".join(lines).encode()).hexdigest(),
                        notes=notes)


def policy_class(spec: str, where: str | None = None) -> type:
    return resolve(spec, where).cls


def construct(source: PolicySource, params: dict[str, Any] | None = None,
              where: str | None = None):
    """An instance of the resolved class with ``params``; a constructor that refuses
    them (or fails) is one line naming the policy."""
    try:
        return source.cls(**(params or {}))
    except (TypeError, ValueError) as exc:
        raise _fail(source.spec, where, str(exc)) from None
    except Exception as exc:   # noqa: BLE001 - a user's constructor: any error is theirs
        if source.kind == BUILTIN:
            raise
        raise _code_error(source.spec, where, exc, "constructing it") from None


def make_policy(spec: str, params: dict[str, Any] | None = None, where: str | None = None):
    """An instance of the policy a spec names, with ``params``."""
    return construct(resolve(spec, where), params, where)


def installed() -> list[dict]:
    """Every policy a plain name reaches or could: the built-in ones, then each installed
    entry point (one that fails to load is listed with its error)."""
    rows = [describe(name) for name in policy_names()]
    for ep in _entry_points():
        row = {"name": ep.name, "kind": ENTRY_POINT, "class": ep.value,
               "distribution": _dist_name(ep),
               "version": ep.dist.version if ep.dist else None}
        if ep.name in _REGISTRY:
            row["shadowed_by"] = "built-in"
            row["error"] = None
            rows.append(row)
            continue
        try:
            src = resolve(ep.name)
        except InputError as exc:
            row["error"] = str(exc)
            rows.append(row)
            continue
        rows.append(_row(src))
    return rows


def describe(spec: str, where: str | None = None) -> dict:
    """``psgate policies``' row for any spec: where its class comes from, its parameters."""
    return _row(resolve(spec, where))


def _row(src: PolicySource) -> dict:
    cls = src.cls
    row = {"name": cls.name, "kind": src.kind, "class": src.class_name,
           "distribution": src.distribution, "version": src.version,
           "summary": cls.summary, "params": dict(cls.defaults),
           "api_version": cls.api_version, "sha256": src.sha256,
           "hints": list(getattr(cls, "honours_hints", ()) or ())}
    if src.file is not None:
        row["file"] = src.file
    return row
