"""Redaction: raw request logs with token ids -> psgate-trace v1 with keyed hashes only.

Raw input, JSON Lines, one request per line (``op`` absent or "request"), or a
cancel ``{"op": "cancel", "id": ..., "t": ...}``:

    {"t": 1.5, "id": "req-77", "group": "acme", "contract": "standard",
     "model": "qwen2.5-1.5b", "tokenizer": "rev-3", "adapter": "", "cache_salt": "acme",
     "prompt_token_ids": [151644, 8948, ...], "out": 128, "done_t": 2.9}

Optional ``output_token_ids`` (the tokens the request generated) become its ``answer``: the
keyed hashes of the full blocks they complete, chained on from the prompt's, so a later
turn whose prompt re-sends them replays as hitting what the server cached while decoding.

Output: the block hashes are keyed BLAKE2b chains (psgate.trace.hashing) whose root
binds the scope (model, tokenizer revision, adapter, cache salt), so equal tokens
under another scope never match. Nothing raw survives: token ids are hashed away,
request ids become r0, r1, ...; group names and scopes become keyed pseudonyms
(g-..., s-...), stable for one key. Contract names are kept: they select the
replay's contract table and are categories, not data. The header carries the key's
fingerprint, never the key; keys come only from a file or the environment.
Retention hints (``priority``, ``priority_until``, ``retention``, ``retention_s``) are
kept as given: they say how long to keep tokens, not which tokens, and name no one.
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Iterator
from pathlib import Path

import orjson

from psgate.errors import InputError
from psgate.inputs import open_input, read_capped
from psgate.trace.hashing import HASHING_NAME, chain_hashes
from psgate.trace.reader import (MAX_BLOCK_SIZE, MAX_JSON_INT, MAX_LINE_BYTES, MAX_TIME_S,
                                 HintError, checked_lines, require_utf8_name,
                                 retention_ranges, retention_seconds)
from psgate.trace.writer import header_line

KEY_ENV = "PSGATE_HASH_KEY"
MIN_KEY_BYTES = 16
MAX_KEY_BYTES = 64                  # BLAKE2b's key size
MAX_KEY_FILE_BYTES = 4096           # 128 hex digits and room for whitespace and comments
_HINT_FIELDS = ("priority", "priority_until", "retention", "retention_s")
_SCOPE_FIELDS = ("model", "tokenizer", "adapter", "cache_salt")
KEY_FORMAT = (f"hex digits for {MIN_KEY_BYTES} to {MAX_KEY_BYTES} bytes (surrounding whitespace "
              f"and newlines ignored), e.g. the output of "
              f"`python -c 'import secrets; print(secrets.token_hex(32))'`")
UNKEYED_WARNING = ("--unkeyed: block hashes and the g-/s- pseudonyms of group (tenant) and scope "
                   "names carry no secret, so anyone holding the trace can test guesses: short "
                   "prompts, and tenant names (g-33f6b2a834a4 is 'acme-corp' for everyone)")


def parse_key(text: bytes | str, where: str) -> bytes:
    """A hash key as written in a key file or an environment variable: hex only.

    One format everywhere, because the same key must give the same hashes whether it came
    from ``--key-file``, ``$PSGATE_HASH_KEY`` or ``$PSGATE_CAPTURE_KEY_FILE``: a file read as
    raw bytes and a variable read as hex would turn one key into two."""
    if isinstance(text, bytes):
        try:
            text = text.decode("ascii")
        except UnicodeDecodeError:
            raise InputError(f"expected the key as {KEY_FORMAT}; found non-ASCII bytes",
                             path=where) from None
    text = text.strip()
    try:
        key = bytes.fromhex(text)
    except ValueError:
        raise InputError(f"expected the key as {KEY_FORMAT}; found characters that are not "
                         f"hex digits", path=where) from None
    if not MIN_KEY_BYTES <= len(key) <= MAX_KEY_BYTES:
        raise InputError(f"expected the key as {KEY_FORMAT}; found {len(key)} bytes",
                         path=where)
    return key


def read_key_file(path: str) -> bytes:
    try:
        text = read_capped(path, "key file", MAX_KEY_FILE_BYTES)
    except OSError as exc:
        raise InputError(f"cannot read the key file: {exc.strerror}", path=path) from None
    return parse_key(text, path)


def load_key(key_file: str | None, unkeyed: bool) -> bytes | None:
    """The hash key from a file, else from $PSGATE_HASH_KEY (both hex); None only if
    unkeyed and neither is given."""
    if key_file:
        return read_key_file(key_file)
    if os.environ.get(KEY_ENV, "").strip():
        return parse_key(os.environ[KEY_ENV], f"${KEY_ENV}")
    if unkeyed:
        return None
    raise InputError("no hash key: pass --key-file FILE or set $PSGATE_HASH_KEY (hex); "
                     "--unkeyed hashes without a key, which lets anyone test guesses "
                     "of short prompts and tenant names against the trace")


def key_fingerprint(key: bytes | None) -> str:
    if key is None:
        return "unkeyed"
    return hashlib.blake2b(key, digest_size=8, person=b"psgate-keyfp").hexdigest()


def pseudonym(kind: str, value: str, key: bytes | None) -> str:
    """A keyed stand-in for an identifier of ``kind`` ("g", "s", "r"): equal values stay
    equal, so who shares what survives redaction, and without the key no name comes back."""
    h = hashlib.blake2b(f"{kind}\x00{value}".encode(), key=key or b"", digest_size=6)
    return f"{kind}-{h.hexdigest()}"


def scope_root(scope: tuple[str, ...], key: bytes | None) -> bytes:
    """The keyed seed of a (group, scope)'s redacted block chain: the same prompt in two
    scopes gets unrelated hashes, as the cache itself never shares across them."""
    data = b"psgate-scope-v1" + b"".join(s.encode() + b"\x00" for s in scope)
    return hashlib.blake2b(data, key=key or b"", digest_size=16).digest()


def redact_lines(src: str | Path, block_size: int, key: bytes | None) -> Iterator[dict]:
    """Stream the redacted trace's lines (header first) from a raw request log, each one
    checked as ``psgate validate`` checks it before it is passed on."""
    if type(block_size) is not int or not 1 <= block_size <= MAX_BLOCK_SIZE:
        raise InputError(f"expected an integer in 1..{MAX_BLOCK_SIZE}, found {block_size!r}",
                         path="--block-size")
    require_utf8_name(str(src))
    return checked_lines(_redacted(str(src), block_size, key), f"{src} (redacted)")


def _redacted(src: str, block_size: int, key: bytes | None) -> Iterator[dict]:
    hkey = key or b""
    yield header_line(block_size, hashing=HASHING_NAME + ("" if key else " (unkeyed)"),
                      source="psgate trace redact",
                      redaction={"key_fingerprint": key_fingerprint(key),
                                 "scope_binds": list(_SCOPE_FIELDS),
                                 "pseudonymized": ["id", "group", "scope"]})
    ids: dict[str, str] = {}
    roots: dict[tuple, bytes] = {}
    last_t = -1.0
    try:
        fh = open_input(src, "request log")
    except OSError as exc:
        raise InputError(f"cannot open: {exc.strerror}", path=src) from None
    with fh:
        n = 0
        while raw := fh.readline(MAX_LINE_BYTES + 1):   # the trace reader's cap on a line
            n += 1

            def err(msg, field=None, n=n):
                return InputError(msg, path=src, line=n, field=field)

            if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
                raise err(f"line longer than {MAX_LINE_BYTES} bytes (the cap on one line, as "
                          f"the trace reader's)")
            if not raw.strip():
                continue

            try:
                obj = orjson.loads(raw)
            except orjson.JSONDecodeError as exc:
                raise err(f"invalid JSON ({exc})") from None
            if type(obj) is not dict:
                raise err("expected a JSON object")
            t = obj.get("t")
            if type(t) not in (int, float) or not math.isfinite(t) or not 0 <= t <= MAX_TIME_S:
                raise err(f"expected a time in 0..{MAX_TIME_S:g} seconds", "t")
            if t < last_t:
                raise err(f"time goes backwards ({t} after {last_t}): sort the log by t", "t")
            last_t = t
            rid = obj.get("id")
            if rid is not None and type(rid) not in (str, int):
                raise err("expected a string or integer", "id")
            op = obj.get("op", "request")
            if op == "cancel":
                if str(rid) not in ids:
                    raise err("cancel of an id with no earlier request", "id")
                yield {"t": t, "op": "cancel", "id": ids[str(rid)]}
                continue
            if op != "request":
                raise err(f"expected request or cancel, found {op!r}", "op")
            toks = obj.get("prompt_token_ids")
            if type(toks) is not list or not toks or not all(
                    type(x) is int and 0 <= x < 2**63 for x in toks):
                raise err("expected a non-empty array of token ids", "prompt_token_ids")
            for f in ("group", "contract"):
                if type(obj.get(f)) is not str or not obj[f]:
                    raise err("expected a non-empty string", f)
            scope = tuple(str(obj.get(f) or "") for f in _SCOPE_FIELDS)
            root = roots.get(scope)
            if root is None:
                root = roots[scope] = scope_root(scope, key)
            out = obj.get("out", 0)
            if type(out) is not int or not 0 <= out <= MAX_JSON_INT:
                raise err("expected an integer >= 0 and <= 2^53 - 1", "out")
            new_id = f"r{len(ids)}"
            if rid is not None:
                if str(rid) in ids:
                    raise err("duplicate request id", "id")
                ids[str(rid)] = new_id
            else:
                ids[f"\x00{n}"] = new_id
            line = {"t": t, "op": "request", "id": new_id,
                    "group": pseudonym("g", obj["group"], key), "contract": obj["contract"],
                    "scope": pseudonym("s", "\x00".join(scope), key),
                    "blocks": chain_hashes(toks, block_size, hkey, parent=root),
                    "tail": len(toks) % block_size, "out": out}
            if "output_token_ids" in obj:
                gen = obj["output_token_ids"]
                if type(gen) is not list or not all(
                        type(x) is int and 0 <= x < 2**63 for x in gen):
                    raise err("expected an array of token ids", "output_token_ids")
                if len(gen) > out:
                    raise err(f"{len(gen)} output tokens, more than out ({out})",
                              "output_token_ids")
                # the answer: the full blocks the output completes, hashed on from the
                # prompt's as the prompt's are (a later prompt that re-sends them hits)
                answer = chain_hashes(toks + gen, block_size, hkey,
                                      parent=root)[len(line["blocks"]):]
                if answer:
                    line["answer"] = answer
            if "done_t" in obj:
                d = obj["done_t"]
                if type(d) not in (int, float) or not math.isfinite(d) or d < t:
                    raise err("expected a time >= t", "done_t")
                if d > MAX_TIME_S:
                    raise err(f"expected a time in 0..{MAX_TIME_S:g} seconds", "done_t")
                line["done_t"] = d
            # retention hints are not identifying: kept as given (checked here, so an error
            # names the log's line; priority/priority_until by the reader, on the output)
            for f in _HINT_FIELDS:
                if f in obj:
                    line[f] = obj[f]
            try:
                if "retention" in obj:
                    retention_ranges(obj["retention"], len(toks))
                if "retention_s" in obj:
                    retention_seconds(obj["retention_s"])
            except HintError as exc:
                raise err(*exc.args) from None
            yield line
