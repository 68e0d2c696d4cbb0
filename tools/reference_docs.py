"""Write the generated reference pages of the docs site from the code that defines them.

    python tools/reference_docs.py            # rewrite the pages
    python tools/reference_docs.py --check    # exit 1 naming each committed page that is stale

- docs/reference/cli.md: every command of the typer app (psgate.cli.app), its summary and
  every option with its help text and default, as the app declares them;
- docs/reference/trace-schema.md and docs/reference/receipt-schema.md: every field of the
  JSON Schemas the trace reader and ``psgate verify`` validate against (schemas/), with its
  type, whether it is required and its description.

The pages are generated so that they cannot drift from the code (tests/test_reference_docs.py
runs --check); they do not depend on the terminal's width or on anything installed beside
psgate.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import typer  # noqa: E402

from psgate.cli import app  # noqa: E402

REF = ROOT / "docs" / "reference"
SCHEMAS = {"trace-schema.md": ("trace.schema.json", "The trace's JSON Schema"),
           "receipt-schema.md": ("receipt.schema.json", "The receipt's JSON Schema")}


def _cell(text: str) -> str:
    """Text that fits in one Markdown table cell."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _first_line(help_text: str | None) -> str:
    return _cell((help_text or "").strip().split("\n\n")[0])


def _commands(group, prefix: str):
    """(full name, command) for every command under ``group``, in name order (click's
    public command attributes, read without importing the click typer carries)."""
    for name in sorted(group.commands):
        cmd = group.commands[name]
        if cmd.hidden:
            continue
        full = f"{prefix} {name}"
        if hasattr(cmd, "commands"):
            yield from _commands(cmd, full)
        else:
            yield full, cmd


def _option_row(p) -> str:
    if p.param_type_name == "argument":
        names = f"`{p.name.upper()}` (argument)"
    else:
        names = ", ".join(f"`{o}`" for o in (*p.opts, *p.secondary_opts))
    if p.required:
        default = "required"
    elif p.param_type_name == "option" and p.secondary_opts:
        default = f"`{p.opts[0] if p.default else p.secondary_opts[0]}`"
    elif p.param_type_name == "option" and p.is_flag:
        default = "on" if p.default else "off"
    elif p.default is None or callable(p.default):
        default = ""
    else:
        default = f"`{p.default}`"
    help_text = getattr(p, "help", None) or ""
    return f"| {names} | {_cell(help_text)} | {default} |"


def cli_page() -> str:
    root = typer.main.get_command(app)
    lines = ["# Command-line reference", "",
             "Generated from psgate's command-line app by `tools/reference_docs.py`; "
             "`psgate COMMAND --help` prints the same, grouped into panels. Exit codes: "
             "[Exit codes](exit-codes.md).", ""]
    cmds = list(_commands(root, "psgate"))
    lines += ["| command | what it does |", "|---|---|"]
    lines += [f"| [`{n}`](#{n.replace(' ', '-')}) | {_first_line(c.help)} |" for n, c in cmds]
    for name, cmd in cmds:
        lines += ["", f"## {name}", ""]
        lines += [(cmd.help or "").strip().replace("\n\n", "\n\n"), ""]
        params = [p for p in cmd.params if p.name != "help" and not getattr(p, "hidden", False)]
        if params:
            lines += ["| option | meaning | default |", "|---|---|---|"]
            lines += [_option_row(p) for p in params]
    return "\n".join(lines) + "\n"


def _type(node: dict) -> str:
    if "$ref" in node:
        return node["$ref"].rsplit("/", 1)[-1]
    if "const" in node:
        return f"`{json.dumps(node['const'])}`"
    if "enum" in node:
        return " \\| ".join(f"`{json.dumps(v)}`" for v in node["enum"])
    for key in ("anyOf", "oneOf"):
        if key in node:
            return " or ".join(_type(n) for n in node[key])
    t = node.get("type", "")
    t = " or ".join(t) if isinstance(t, list) else t
    if t == "array" and isinstance(node.get("items"), dict):
        return f"array of {_type(node['items'])}"
    return t or "any"


def _object_rows(node: dict, path: str, out: list[str], depth: int) -> None:
    required = set(node.get("required", ()))
    for name, sub in node.get("properties", {}).items():
        field = f"{path}.{name}" if path else name
        out.append(f"| `{field}` | {_cell(_type(sub))} | {'yes' if name in required else ''} "
                   f"| {_cell(sub.get('description', ''))} |")
        if depth < 3 and sub.get("type") == "object" and "properties" in sub:
            _object_rows(sub, field, out, depth + 1)


def schema_page(file: str, title: str) -> str:
    schema = json.loads((ROOT / "schemas" / file).read_text())
    lines = [f"# {title}", "",
             f"Generated from `schemas/{file}` by `tools/reference_docs.py`. "
             f"{_cell(schema.get('description', ''))}", ""]
    head = ["| field | type | required | description |", "|---|---|---|---|"]
    if "properties" in schema:
        rows: list[str] = []
        _object_rows(schema, "", rows, 0)
        lines += ["## Top level", "", *head, *rows, ""]
    for name, node in schema.get("$defs", {}).items():
        lines += [f"## {name}", ""]
        if node.get("description"):
            lines += [_cell(node["description"]), ""]
        rows = []
        _object_rows(node, "", rows, 0)
        if rows:
            lines += [*head, *rows, ""]
        else:
            lines += [f"Type: {_cell(_type(node))}.", ""]
    return "\n".join(lines).rstrip("\n") + "\n"


def pages() -> dict[Path, str]:
    out = {REF / "cli.md": cli_page()}
    for page, (file, title) in SCHEMAS.items():
        out[REF / page] = schema_page(file, title)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare, write nothing")
    args = ap.parse_args()
    stale = []
    for path, text in pages().items():
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(str(path.relative_to(ROOT)))
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    if stale:
        print(f"stale: {', '.join(stale)}; run python tools/reference_docs.py",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
