"""Content keys: the one integer that names what a cached block holds.

A key is ``(namespace_id << KEY_SHIFT) | hash_id``: the namespace (a (group, scope) pair,
numbered by first appearance in the trace) in the high bits and the trace hash's dense index
(:class:`~psgate.trace.reader.HashTable`) in the low ones. Keeping the namespace inside the
key makes two groups' identical prompts different content, as vLLM's cache salt does, while
the hash index stays recoverable without a dict. The engines, the trace's future and trace
stats must number content alike, so they all build keys here; per-block loops shift inline
with :data:`KEY_SHIFT` and :data:`HASH_MASK` rather than pay for a call.
"""

from __future__ import annotations

KEY_SHIFT = 32
HASH_MASK = (1 << KEY_SHIFT) - 1
# Blocks that hold no trace hash (a full block of a prompt's tail and generated tokens, cached
# by the step scheduler as vLLM caches it) get ``OUTPUT_KEY_BIT | request_index << 24 | pos``:
# unique to their request, never equal to a trace block's key, so only that request (resumed
# after a preemption) can hit them.
OUTPUT_KEY_BIT = 1 << 62
# A hybrid model's KV-cache group g > 0 (psgate.engines.kv_groups) holds its blocks under
# keys with g in bits 56-60, its own content; group 0's keys are the keys above. Namespaces
# then keep below 2**24, request indexes below 2**32.
KV_GROUP_SHIFT = 56
MAX_HYBRID_NAMESPACES = 1 << (KV_GROUP_SHIFT - KEY_SHIFT)


def content_key(namespace_id: int, hash_id: int) -> int:
    """The key of trace hash ``hash_id`` cached in namespace ``namespace_id``."""
    return (namespace_id << KEY_SHIFT) | hash_id


def split_key(key: int) -> tuple[int, int]:
    """``(namespace_id, hash_id)`` of a key built by :func:`content_key`."""
    return key >> KEY_SHIFT, key & HASH_MASK


def output_key(request_index: int, pos: int, kv_group: int = 0) -> int:
    """The key of block ``pos`` of request ``request_index`` beyond its trace blocks."""
    return OUTPUT_KEY_BIT | (kv_group << KV_GROUP_SHIFT) | (request_index << 24) | pos


def kv_group_namespace(namespace_id: int, kv_group: int) -> int:
    """The namespace id under which KV-cache group ``kv_group`` caches a namespace's
    content (the namespace itself for group 0)."""
    return namespace_id | (kv_group << (KV_GROUP_SHIFT - KEY_SHIFT))


def chain_key(chain, namespace_id: int, request_index: int, pos: int,
              kv_group: int = 0) -> int:
    """The key of position ``pos`` of a request whose trace blocks and answer are
    ``chain`` (hash ids), in KV-cache group ``kv_group``: past the chain, its own output
    block."""
    if pos < len(chain):
        return (kv_group_namespace(namespace_id, kv_group) << KEY_SHIFT) | chain[pos]
    return output_key(request_index, pos, kv_group)
