"""Mooncake FAST'25 traces (kvcache-ai/Mooncake), JSON Lines: ``timestamp`` (ms,
relative), ``input_length``, ``output_length``, ``hash_ids`` (prefix-consistent ids of
512-token blocks, ``len == ceil(input_length / 512)``: when the input is not a multiple of
512 the last id covers a partial block). ``t = timestamp / 1000``. Request ids
``mc-<line>``; scope ``mooncake``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from psgate.errors import InputError
from psgate.trace.importers.common import (Chainer, ImportFormat, Option, OutputCap, Req, Where,
                                           common_options, finish, jsonl, need_ids, need_int,
                                           need_time, open_file, output_block_size, split_ids,
                                           trace_time)

FORMAT = ImportFormat(
    "mooncake", "Mooncake FAST'25 traces (JSON Lines, 512-token hash_ids, ms timestamps)",
    "a .jsonl file",
    {**common_options("none", "none (one group 'all') | root-block (group root-<hash_ids[0]>) "
                              "| hash-mod:N (group g<k>, k = hash_ids[1] mod N, or "
                              "hash_ids[0] mod N for a one-block request)"),
     "native_block_size": Option(512, int, "tokens per source hash id")})


def _grouper(spec: str) -> tuple[Callable[[list[int]], str], str]:
    if spec == "none":
        return (lambda ids: "all"), "one group 'all'"
    if spec == "root-block":
        return (lambda ids: f"root-{ids[0]}"), (
            "group root-<hash_ids[0]>: requests whose first 512-token block is the same id "
            "share a group (in Mooncake's conversation trace every request starts with id 0, "
            "so this is one group there)")
    if spec.startswith("hash-mod:"):
        try:
            n = int(spec[len("hash-mod:"):])
        except ValueError:
            n = 0
        if n < 1:
            raise InputError(f"expected hash-mod:N with an integer N >= 1, found '{spec}'",
                             path="--group-by")
        return (lambda ids: f"g{(ids[1] if len(ids) > 1 else ids[0]) % n}"), (
            f"group g<k>, k = hash_ids[1] mod {n} (hash_ids[0] mod {n} for a one-block "
            "request): hash_ids[0] is the system-prompt block every conversation-trace "
            "request shares, the second id follows the conversation, so requests sharing "
            "more than the first block share a group")
    raise InputError(f"expected none, root-block or hash-mod:N, found '{spec}'",
                     path="--group-by")


def import_file(src: Path, display: str, opts: dict) -> list[dict]:
    open_file(src, display)
    native = opts["native_block_size"]
    bs = output_block_size(opts, native, "--native-block-size")
    grouper, tenant_rule = _grouper(opts["group_by"])
    chainer = Chainer(native, bs, OutputCap(opts["max_output_bytes"]))
    reqs: list[Req] = []
    for lineno, obj in jsonl(src, display):
        where = Where(display, lineno)
        ts = need_time(obj, "timestamp", where)
        n_in = need_int(obj, "input_length", where, 1)
        n_out = need_int(obj, "output_length", where, 0)
        ids = need_ids(obj, "hash_ids", where)
        covered_last, uncovered = split_ids(len(ids), n_in, native, "ceil", where, "hash_ids")
        rid = f"mc-{lineno}"
        blocks, tail = chainer.blocks("mooncake", "mooncake", ids, covered_last, uncovered,
                                      rid, where, f"line {lineno}", "hash_ids")
        t = trace_time(round(ts / 1000, 9), where, "timestamp", "timestamp / 1000")
        reqs.append(Req(t, rid, grouper(ids), "mooncake", blocks, tail,
                         n_out, chainer.last_unidentified))
    if not reqs:
        raise InputError("no requests in the file", path=display)
    return finish("mooncake", reqs, opts, bs=bs, native=native,
                   source=f"mooncake:{src.name}",
                   space_rule="one id space for the whole trace (S = 'mooncake')",
                   tenant_rule=tenant_rule,
                   time_rule="t = timestamp / 1000 (ms to s); ties keep file order",
                   extra={"file": src.name})


# --------------------------------------------------------------------------------------
# WEKA / kv-cache-tester
