"""Alibaba Qwen/Bailian usage traces, JSON Lines: ``chat_id``, ``parent_chat_id`` (-1,
null or missing for a root), ``timestamp`` (s), ``input_length``, ``output_length``,
``type``, ``turn``, ``hash_ids`` (16-token blocks; ``len`` may be ``floor`` or ``ceil`` of
``input_length / 16``: with ``ceil`` the last id covers a partial block).
``t = timestamp - (earliest timestamp)``. Request ids ``bl-<line>``; scope ``bailian``.
"""

from __future__ import annotations

from pathlib import Path

from psgate.errors import InputError
from psgate.trace.importers.common import (Chainer, ImportFormat, Option, OutputCap, Req, Where,
                                           common_options, finish, is_int, jsonl, need_ids,
                                           need_int, need_time, open_file, output_block_size,
                                           split_ids, trace_time)
from psgate.trace.reader import type_name

FORMAT = ImportFormat(
    "bailian", "Alibaba Qwen/Bailian usage traces (JSON Lines, 16-token hash_ids, "
               "chat_id/parent_chat_id chains)",
    "a .jsonl file",
    {**common_options("chat", "chat (group chat-<root chat id> along parent_chat_id) | "
                              "type (the request's 'type') | none (one group 'all')"),
     "native_block_size": Option(16, int, "tokens per source hash id")})


def _is_root_marker(v) -> bool:
    return v is None or v == -1 or v == "-1" or v == ""


def import_file(src: Path, display: str, opts: dict) -> list[dict]:
    open_file(src, display)
    native = opts["native_block_size"]
    bs = output_block_size(opts, native, "--native-block-size")
    group_by = opts["group_by"]
    if group_by not in ("chat", "type", "none"):
        raise InputError(f"expected chat, type or none, found '{group_by}'", path="--group-by")
    chainer = Chainer(native, bs, OutputCap(opts["max_output_bytes"]))
    rows = []
    parent_of: dict = {}
    line_of: dict = {}
    for lineno, obj in jsonl(src, display):
        where = Where(display, lineno)
        if "chat_id" not in obj:
            raise where("missing", "chat_id")
        cid = obj["chat_id"]
        if not (is_int(cid) or (type(cid) is str and cid)):
            raise where(f"expected an integer or a non-empty string, found {type_name(cid)}",
                        "chat_id")
        if cid in line_of:
            raise where(f"duplicate chat_id {cid!r:.40} (first on line {line_of[cid]})",
                        "chat_id")
        pid = obj.get("parent_chat_id")
        if not (_is_root_marker(pid) or is_int(pid) or type(pid) is str):
            raise where(f"expected a chat id, -1 or null, found {type_name(pid)}",
                        "parent_chat_id")
        if pid == cid:
            raise where("a chat cannot be its own parent", "parent_chat_id")
        ts = need_time(obj, "timestamp", where)
        n_in = need_int(obj, "input_length", where, 1)
        n_out = need_int(obj, "output_length", where, 0)
        ids = need_ids(obj, "hash_ids", where)
        typ = obj.get("type")
        if group_by == "type" and (type(typ) is not str or not typ):
            raise where(f"expected a non-empty string (group_by type), found "
                        f"{'nothing' if 'type' not in obj else type_name(typ)}", "type")
        covered_last, uncovered = split_ids(len(ids), n_in, native, "either", where,
                                             "hash_ids")
        rid = f"bl-{lineno}"
        blocks, tail = chainer.blocks("bailian", "bailian", ids, covered_last, uncovered, rid,
                                      where, f"line {lineno}", "hash_ids")
        line_of[cid] = lineno
        parent_of[cid] = None if _is_root_marker(pid) else pid
        rows.append((lineno, cid, ts, typ, blocks, tail, n_out, chainer.last_unidentified))
    if not rows:
        raise InputError("no requests in the file", path=display)

    root_of: dict = {}

    def root(cid):
        path = []
        c = cid
        while c not in root_of:
            p = parent_of.get(c)
            if p is None or p not in parent_of:
                # a root, or its parent lies outside the file: the chain starts here
                root_of[c] = c if p is None else p
                break
            path.append(c)
            if len(path) > len(parent_of):
                raise InputError(f"parent_chat_id chain from chat {cid!r:.40} loops",
                                 path=display, line=line_of[cid], field="parent_chat_id")
            c = p
        r = root_of[c]
        for x in path:
            root_of[x] = r
        return r

    t0 = min(r[2] for r in rows)
    reqs = []
    for lineno, cid, ts, typ, blocks, tail, n_out, unid in rows:
        trace_time(ts - t0, Where(display, lineno), "timestamp",
                    f"timestamp - earliest timestamp {t0:g}")
        group = {"chat": lambda: f"chat-{root(cid)}", "type": lambda: typ,
                 "none": lambda: "all"}[group_by]()
        reqs.append(Req(round(ts - t0, 9), f"bl-{lineno}", group, "bailian", blocks, tail,
                         n_out, unid))
    tenant_rule = {"chat": "group chat-<R>, R = the root of the request's parent_chat_id chain "
                           "(a chat with parent -1, null or missing is a root; a parent not in "
                           "the file is taken as the root)",
                   "type": "group = the request's 'type' field",
                   "none": "one group 'all'"}[group_by]
    return finish("bailian", reqs, opts, bs=bs, native=native, source=f"bailian:{src.name}",
                   space_rule="one id space for the whole trace (S = 'bailian')",
                   tenant_rule=tenant_rule,
                   time_rule="t = timestamp - earliest timestamp in the file (s); ties keep "
                             "file order",
                   extra={"file": src.name, "t0": t0})
