"""kv-cache-tester agentic sessions (callanjfox/kv-cache-tester traces/): a directory of
session files, or one file; one JSON object per file with ``id``, ``block_size`` (64),
``hash_id_scope`` ("local": ids are per file) and ``requests[]`` (``t`` in s, ``type``,
``model``, ``in``, ``out``, ``hash_ids`` of full blocks only, ``len == floor(in / 64)``).

Sub-agent conversations are nested: a request with ``type: "subagent"`` carries no prompt
of its own but its own ``requests[]`` (plus ``agent_id``, ``subagent_type``,
``duration_ms``, ``models``, ...) whose ``t`` are relative to the sub-agent's ``t``. They
are flattened (recursively) with absolute time = file offset + sub-agent ``t`` + nested
``t``; their ids are ``<file>-<i>.<j>``, top-level ones ``<file>-<i>`` (``<file>`` = the
file name without ``.json``). Files are taken in file-name order; file k starts at offset
``k * stagger_s`` (default 0: every session starts at t = 0), keeping its relative times.
Each distinct ``model`` is its own ``scope``.
"""

from __future__ import annotations

from pathlib import Path

import orjson

from psgate.errors import InputError
from psgate.inputs import read_input
from psgate.trace.importers.common import (Chainer, ImportFormat, Option, OutputCap, Req, Where,
                                           common_options, finish, need_ids, need_int,
                                           need_time, output_block_size, split_ids,
                                           trace_time)
from psgate.trace.reader import type_name

FORMAT = ImportFormat(
    "weka", "kv-cache-tester agentic sessions (a directory of JSON files, one per "
            "conversation; nested sub-agents flattened)",
    "a directory of .json session files, or one file",
    {**common_options("file", "file (one group per session file) | type (the request's "
                              "'type') | none (one group 'all')"),
     "stagger_s": Option(0.0, float, "session k (file-name order) starts at k * "
                                     "stagger_s seconds")})


def import_file(src: Path, display: str, opts: dict) -> list[dict]:
    if not src.exists():
        raise InputError("no such file or directory", path=display)
    if src.is_dir():
        files = sorted(p for p in src.iterdir() if p.suffix == ".json" and p.is_file())
        if not files:
            raise InputError("no .json session files in this directory", path=display)
        source = f"weka:{src.name}/ ({len(files)} session files)"
    else:
        files = [src]
        source = f"weka:{src.name}"
    group_by = opts["group_by"]
    if group_by not in ("file", "type", "none"):
        raise InputError(f"expected file, type or none, found '{group_by}'", path="--group-by")
    stagger = opts["stagger_s"]
    chainers: dict[int, Chainer] = {}
    cap = OutputCap(opts["max_output_bytes"])       # one for all the sessions' chainers
    reqs: list[Req] = []
    file_info = []
    native_sizes = set()
    nested_total = 0
    for k, path in enumerate(files):
        fdisplay = str(path) if path != src else display
        try:
            obj = orjson.loads(read_input(path, "trace file"))
        except OSError as exc:
            raise InputError(f"cannot read: {exc.strerror}", path=fdisplay) from None
        except orjson.JSONDecodeError as exc:
            raise InputError(f"invalid JSON ({exc})", path=fdisplay) from None
        top = Where(fdisplay)
        if type(obj) is not dict:
            raise top(f"expected one JSON object, found {type_name(obj)}")
        native = need_int(obj, "block_size", top, 1)
        native_sizes.add(native)
        bs = output_block_size(opts, native, f"{fdisplay}: block_size")
        scope_kind = obj.get("hash_id_scope", "local")
        if scope_kind not in ("local", "global"):
            raise top(f"expected 'local' or 'global', found {scope_kind!r:.40}", "hash_id_scope")
        stem = path.stem
        space = stem if scope_kind == "local" else "weka"
        chainer = chainers.get(native * 100000 + bs)
        if chainer is None:
            chainer = chainers[native * 100000 + bs] = Chainer(native, bs, cap)
        offset = round(k * stagger, 9)
        if "requests" not in obj:
            raise top("missing", "requests")
        counts = {"requests": 0, "nested": 0}

        def walk(items, base_t: float, rid_prefix: str, field_prefix: str, depth: int) -> None:
            if type(items) is not list:
                raise Where(fdisplay)(f"expected an array, found {type_name(items)}",
                                       field_prefix.rstrip(".") or "requests")
            for i, r in enumerate(items):
                fp = f"{field_prefix}[{i}]."
                where = Where(fdisplay, None, fp)
                if type(r) is not dict:
                    raise Where(fdisplay)(f"expected an object, found {type_name(r)}", fp[:-1])
                t_rel = need_time(r, "t", where)
                t = trace_time(base_t + t_rel, where, "t", "session offset + t")
                rid = f"{rid_prefix}{i}"
                if r.get("type") == "subagent" or "requests" in r:
                    if "requests" not in r:
                        raise where("missing: a subagent entry carries its own requests",
                                    "requests")
                    walk(r["requests"], t, rid + ".", fp + "requests", depth + 1)
                    continue
                model = r.get("model")
                if type(model) is not str or not model:
                    raise where(f"expected a non-empty string, found "
                                f"{'nothing' if 'model' not in r else type_name(model)}", "model")
                n_in = need_int(r, "in", where, 1)
                n_out = need_int(r, "out", where, 0)
                ids = need_ids(r, "hash_ids", where)
                if group_by == "type":
                    typ = r.get("type")
                    if type(typ) is not str or not typ:
                        raise where(f"expected a non-empty string (group_by type), found "
                                    f"{'nothing' if 'type' not in r else type_name(typ)}", "type")
                    group = typ
                elif group_by == "file":
                    group = stem
                else:
                    group = "all"
                covered_last, uncovered = split_ids(len(ids), n_in, native, "floor", where,
                                                     "hash_ids")
                blocks, tail = chainer.blocks(
                    space, f"{space}\x00{model}", ids, covered_last, uncovered, rid, where,
                    f"{path.name} {fp[:-1]}", "hash_ids")
                reqs.append(Req(round(t, 9), rid, group, model, blocks, tail, n_out,
                                 chainer.last_unidentified))
                counts["requests"] += 1
                if depth:
                    counts["nested"] += 1

        walk(obj["requests"], offset, f"{stem}-", "requests", 0)
        nested_total += counts["nested"]
        file_info.append({"file": path.name, "id": obj.get("id") if type(obj.get("id")) is str
                          else None, "offset_s": offset, "requests": counts["requests"],
                          "nested_requests": counts["nested"]})
    if not reqs:
        raise InputError("no requests in the session file(s)", path=display)
    if len(native_sizes) > 1:
        raise InputError(f"session files disagree on block_size ({sorted(native_sizes)}); "
                         "import them separately", path=display)
    native = native_sizes.pop()
    bs = opts["block_size"] or native
    tenant_rule = {"file": "one group per session file, named after the file (its name "
                           "without .json)",
                   "type": "group = the request's 'type' field as found (n or s in the "
                           "kv-cache-tester sample)",
                   "none": "one group 'all'"}[group_by]
    return finish(
        "weka", reqs, opts, bs=bs, native=native, source=source,
        space_rule="S = the session file's name without .json (hash_id_scope 'local') or 'weka' "
                   "('global'), "
                   "then NUL and the request's model: ids never meet across files or models",
        tenant_rule=tenant_rule,
        time_rule=("session file k (file-name order, 0-based) starts at k * stagger_s; "
                   "t = offset + request t; a nested sub-agent request (inside a "
                   "type 'subagent' entry's requests[]) has t = offset + sub-agent t + its "
                   "own t; ties keep file, then request order"),
        extra={"files": file_info, "nested_requests": nested_total})


# --------------------------------------------------------------------------------------
# Alibaba Qwen / Bailian
