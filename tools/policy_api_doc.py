"""Write docs/policy-api.md, the reference of psgate's policy API, from its docstrings.

    python tools/policy_api_doc.py            # rewrite docs/policy-api.md
    python tools/policy_api_doc.py --check    # exit 1 when the committed page is stale

Every name in ``psgate.policy.__all__``, in that order: its signature and docstring; for a
class, each public method and property with its own. The page is generated so that it
cannot drift from the code a policy is written against (tests/policy/test_api_doc.py
runs --check). It is read from the source as written: psgate is imported interpreted
(``PSGATE_CORE=0``), so a class that the install compiles (``PrefixHistory``) shows its
Python signatures, the same page with a compiler or without.
"""

from __future__ import annotations

import argparse
import inspect
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ["PSGATE_CORE"] = "0"         # before psgate is imported: its .py sources

import psgate.policy as api  # noqa: E402

PAGE = ROOT / "docs" / "policy-api.md"


def _doc(obj) -> str:
    return inspect.cleandoc(obj.__doc__ or "").strip()


def _annotation(a) -> str:
    return a if isinstance(a, str) else inspect.formatannotation(a)


def _signature(name: str, obj) -> str:
    """``name(params) -> returns`` with annotations as written (they are strings here)."""
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return name
    params = []
    for p in sig.parameters.values():
        text = ("*" if p.kind is p.VAR_POSITIONAL else "**" if p.kind is p.VAR_KEYWORD
                else "") + p.name
        if p.annotation is not p.empty:
            text += f": {_annotation(p.annotation)}"
        if p.default is not p.empty:
            text += f" = {p.default!r}"
        params.append(text)
    out = f"{name}({', '.join(params)})"
    if sig.return_annotation not in (sig.empty, None, "None"):
        out += f" -> {_annotation(sig.return_annotation)}"
    return out


def _members(cls) -> list[tuple[str, object]]:
    out = []
    for name, value in vars(cls).items():
        if name.startswith("_"):
            continue
        if isinstance(value, (staticmethod, classmethod)):
            value = value.__func__
        if inspect.isfunction(value) or isinstance(value, property):
            out.append((name, value))
    return out


def render() -> str:
    lines = ["# The policy API (psgate.policy)", "",
             "Generated from the docstrings by `python tools/policy_api_doc.py`; do not edit.",
             "", f"Policy API version: **{api.API_VERSION}**.", "", _doc(api), ""]
    for name in api.__all__:
        obj = getattr(api, name)
        if inspect.isclass(obj):
            lines += [f"## class `{_signature(name, obj)}`", "", _doc(obj), ""]
            attrs = [f"- `{a}: {_annotation(t)} = {getattr(obj, a)!r}`"
                     for a, t in vars(obj).get("__annotations__", {}).items()
                     if "ClassVar" in _annotation(t)]
            if attrs:
                lines += ["Class attributes:", "", *attrs, ""]
            for member, value in _members(obj):
                if isinstance(value, property):
                    lines += [f"### property `{name}.{member}`", "", _doc(value.fget), ""]
                else:
                    lines += [f"### `{name}.{_signature(member, value)}`", "", _doc(value), ""]
        elif inspect.isfunction(obj):
            lines += [f"## function `{_signature(name, obj)}`", "", _doc(obj), ""]
        else:
            lines += [f"## `{name}` = `{obj!r}`", ""]
    text = "\n".join(lines)
    while "\n\n\n" in text:
        text = text.replace("\n\n\n", "\n\n")
    return text.rstrip() + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare instead of writing")
    args = ap.parse_args()
    text = render()
    if args.check:
        if not PAGE.is_file() or PAGE.read_text() != text:
            print(f"{PAGE.relative_to(ROOT)} is stale: run python tools/policy_api_doc.py",
                  file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(text)
    print(f"wrote {PAGE.relative_to(ROOT)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
