"""Keyed chained block hashing: how token ids become redacted trace block hashes.

    h_0 = BLAKE2b-128(key, "psgate-block-v1" || 0-parent || tokens_0)
    h_i = BLAKE2b-128(key, "psgate-block-v1" || h_{i-1}   || tokens_i)

The chain makes a hit a contiguous prefix (equal h_i means equal tokens in
blocks 0..i); the key makes hashes useless for guessing short prompts without
it. Only full blocks are hashed; the partial last block becomes ``tail``.
"""

from __future__ import annotations

import hashlib
import struct

HASHING_NAME = "keyed-blake2b-128"
_DOMAIN = b"psgate-block-v1"
_ZERO = bytes(16)


def chain_hashes(token_ids: list[int], block_size: int, key: bytes,
                 parent: bytes | None = None) -> list[str]:
    """Lowercase hex hashes of the full blocks of ``token_ids``."""
    if len(key) > 64:
        raise ValueError("hash key longer than 64 bytes")
    out = []
    prev = parent or _ZERO
    n_full = len(token_ids) // block_size
    for i in range(n_full):
        block = token_ids[i * block_size:(i + 1) * block_size]
        h = hashlib.blake2b(_DOMAIN + prev + struct.pack(f"<{block_size}q", *block),
                            key=key, digest_size=16).digest()
        out.append(h.hex())
        prev = h
    return out
