"""Contracts: how fast each group may create cache content, as a domain concept.

A contract is a token bucket over block creation: ``[rho, beta]`` is the refill rate in
blocks per second and the burst in blocks. Traces name a contract per request, workloads
assign them, the PrefixShield family charges against them and trace stats compare a
group's creation rate with its refill. They all read the one table here, so this module
sits below every package and imports nothing from psgate but its error type.

A contracts file (``--contracts FILE``, TOML) replaces the trace's labels: it gives named
groups a contract of their own and every other group a named default class, so that one
file says what each group may create whatever the trace claims::

    version = 1
    default = "best-effort"            # the class of every group not listed below

    [classes]                          # optional; absent: the three built-in classes
    best-effort = { refill = 16.0, burst = 128.0 }

    [[groups]]
    name = "tenant-a"
    refill = 12.5                      # blocks per second
    burst = 300.0                      # blocks

A listed group's requests are all charged to its own contract, named ``@`` + the group in
ledgers and receipts; an unlisted group's to the default class.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import tomllib
from dataclasses import dataclass, field

from psgate.errors import InputError
from psgate.inputs import read_capped

# name -> [refill rho (blocks/s), burst beta (blocks)]; lists, as receipts record them.
DEFAULT_CONTRACTS: dict[str, list[float]] = {"critical": [64.0, 256.0],
                                             "standard": [40.0, 192.0],
                                             "best-effort": [16.0, 128.0]}
# The contract names in the table's order, for workloads that cycle through them.
CONTRACT_NAMES: tuple[str, ...] = ("critical", "standard", "best-effort")

CONTRACTS_FILE_VERSION = 1
GROUP_PREFIX = "@"          # a group's own contract is named "@<group>"
MAX_CONTRACTS_FILE_BYTES = 16 << 20
# The PrefixShield family keeps each block's contract as a one-byte index, so one table
# holds at most 127 contracts: classes and listed groups together.
MAX_CONTRACTS = 127


def group_contract(group: str) -> str:
    """The name of ``group``'s own contract in a contracts file's table."""
    return GROUP_PREFIX + group


@dataclass(frozen=True)
class ContractsFile:
    """A contracts file, checked: the classes, the default class, each listed group's own
    ``[refill, burst]``, and the file's SHA-256 (a receipt records it)."""

    path: str
    sha256: str
    default: str
    classes: dict[str, list[float]]
    groups: dict[str, list[float]] = field(default_factory=dict)

    def contract_of(self, group: str) -> str:
        """The contract ``group``'s requests are charged to under this file."""
        return group_contract(group) if group in self.groups else self.default

    def table(self) -> dict[str, list[float]]:
        """Every contract the file defines, classes and groups' own, as the PrefixShield
        family's ``contracts`` parameter takes them."""
        return {**self.classes, **{group_contract(g): list(v) for g, v in self.groups.items()}}

    def relabelled(self, events):
        """``events`` with every request's contract replaced by the one this file gives
        its group (each request changed is a copy; other events pass unchanged)."""
        of = self.contract_of
        for ev in events:
            group = getattr(ev, "group", None)
            if group is not None and ev.contract != (c := of(group)):
                ev = _with_contract(ev, c)
            yield ev

    def to_json(self) -> dict:
        return {"path": self.path, "sha256": self.sha256, "default": self.default,
                "num_groups": len(self.groups)}


def _with_contract(ev, contract: str):
    return dataclasses.replace(ev, contract=contract)


def _number(v, where: str, path: str, minimum: float, what: str) -> float:
    found = repr(v)
    try:
        x = float(v) if type(v) in (int, float) else math.nan
    except OverflowError:           # an integer no float holds
        x, found = math.inf, f"an integer of {len(str(v))} digits"
    if not math.isfinite(x) or x < minimum or (minimum == 0 and x <= 0):
        raise InputError(f"expected {what}, found {found}", path=path, field=where)
    return x


def _bucket(spec, where: str, path: str) -> list[float]:
    if not isinstance(spec, dict):
        raise InputError(f"expected a table with refill and burst, found {type(spec).__name__}",
                         path=path, field=where)
    extra = sorted(set(spec) - {"refill", "burst", "name"})
    if extra:
        raise InputError(f"unknown key '{extra[0]}' (expected refill and burst)", path=path,
                         field=where)
    for key in ("refill", "burst"):
        if key not in spec:
            raise InputError("missing", path=path, field=f"{where}.{key}")
    return [_number(spec["refill"], f"{where}.refill", path, 0,
                    "a finite refill > 0 blocks per second"),
            _number(spec["burst"], f"{where}.burst", path, 1,
                    "a finite burst of at least 1 block")]


def parse_contracts(text: str, path: str, sha256: str = "") -> ContractsFile:
    """A contracts file's text, checked; bad input names the file and the field."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"not TOML ({exc})", path=path) from None
    extra = sorted(set(doc) - {"version", "default", "classes", "groups"})
    if extra:
        raise InputError("unknown key (expected version, default, classes, groups)",
                         path=path, field=extra[0])
    if type(doc.get("version")) is not int or doc["version"] != CONTRACTS_FILE_VERSION:
        raise InputError(f"expected {CONTRACTS_FILE_VERSION}, found {doc.get('version')!r}",
                         path=path, field="version")
    raw_classes = doc.get("classes")
    if raw_classes is None:
        classes = {k: list(v) for k, v in DEFAULT_CONTRACTS.items()}
    elif not isinstance(raw_classes, dict) or not raw_classes:
        raise InputError("expected a table of one or more classes", path=path, field="classes")
    else:
        classes = {}
        for name, spec in raw_classes.items():
            if not name or name.startswith(GROUP_PREFIX):
                raise InputError(f"a class name must be non-empty and not start with "
                                 f"'{GROUP_PREFIX}', found {name!r}", path=path,
                                 field=f"classes.{name}")
            classes[name] = _bucket(spec, f"classes.{name}", path)
    default = doc.get("default")
    if not isinstance(default, str) or default not in classes:
        raise InputError(f"expected the name of a class ({', '.join(sorted(classes))}), found "
                         f"{default!r}", path=path, field="default")
    raw_groups = doc.get("groups", [])
    if not isinstance(raw_groups, list):
        raise InputError("expected an array of tables ([[groups]])", path=path, field="groups")
    groups: dict[str, list[float]] = {}
    first: dict[str, int] = {}
    for i, spec in enumerate(raw_groups):
        where = f"groups[{i}]"
        name = spec.get("name") if isinstance(spec, dict) else None
        if not isinstance(name, str) or not name:
            raise InputError(f"expected a non-empty group name, found {name!r}", path=path,
                             field=f"{where}.name")
        if name in groups:
            raise InputError(f"group {name!r} is named twice (first in groups[{first[name]}])",
                             path=path, field=f"{where}.name")
        first[name] = i
        groups[name] = _bucket(spec, where, path)
    if len(classes) + len(groups) > MAX_CONTRACTS:
        raise InputError(f"{len(classes) + len(groups)} contracts (classes and groups), at "
                         f"most {MAX_CONTRACTS}: PrefixShield keeps a contract index in one "
                         f"byte per block", path=path, field="groups")
    return ContractsFile(path, sha256, default, classes, groups)


def load_contracts(path: str) -> ContractsFile:
    """The contracts file at ``path``, checked (exit 2 with one line when it is not one)."""
    try:
        data = read_capped(path, "contracts file", MAX_CONTRACTS_FILE_BYTES)
    except OSError as exc:
        raise InputError(f"cannot read the contracts file: {exc.strerror or exc}",
                         path=path) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"byte {exc.start + 1} is not UTF-8 (expected a TOML file)",
                         path=path) from None
    return parse_contracts(text, path, hashlib.sha256(data).hexdigest())


def _toml_str(s: str) -> str:
    # JSON's escapes are TOML's, but TOML also forbids a raw DEL in a string
    return json.dumps(s, ensure_ascii=False).replace("\x7f", "\\u007f")


def _comment(text: str) -> str:
    return " ".join(text.splitlines())


def _toml_float(x: float) -> str:
    return repr(float(x))


def dumps_contracts(default: str, classes: dict[str, list[float]],
                    groups: dict[str, list[float]], comments: list[str] = (),
                    notes: dict[str, str] | None = None) -> str:
    """A contracts file's text; ``comments`` open it, ``notes`` (group -> text) follow
    each group's entry. It reads back as the same contracts (parse_contracts)."""
    out = [f"# {_comment(c)}" if c else "#" for c in comments]
    out += [f"version = {CONTRACTS_FILE_VERSION}",
            f"default = {_toml_str(default)}    # the class of every group not listed", "",
            "[classes]    # refill in blocks per second, burst in blocks"]
    for name in sorted(classes):
        rho, beta = classes[name]
        out.append(f"{_toml_str(name)} = {{ refill = {_toml_float(rho)}, "
                   f"burst = {_toml_float(beta)} }}")
    for name in sorted(groups):
        rho, beta = groups[name]
        out += ["", "[[groups]]", f"name = {_toml_str(name)}",
                f"refill = {_toml_float(rho)}", f"burst = {_toml_float(beta)}"]
        if notes and name in notes:
            out.append(f"# {_comment(notes[name])}")
    return "\n".join(out) + "\n"


def contracts_params(params: dict, defaults: dict, contracts: ContractsFile | None,
                     option: str) -> dict:
    """A policy's parameters under a contracts file: a policy with a ``contracts``
    parameter (the PrefixShield family) gets the file's table; one without it is
    contract-blind and keeps its parameters. A different table given as a parameter as
    well is refused: one run has one table."""
    if contracts is None or "contracts" not in defaults:
        return params
    table = contracts.table()
    if "contracts" in params and params["contracts"] != table:
        raise InputError(f"a 'contracts' parameter and --contracts {contracts.path} disagree: "
                         f"one run has one table (drop the parameter)", path=option)
    return {**params, "contracts": table}
