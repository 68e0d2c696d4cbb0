"""``--option answers=infer``: tie a later turn's prompt blocks to an earlier request's answer.

No public trace records outputs, but in a chat the next turn re-sends the previous prompt
and its answer, so the blocks a follower adds right after its predecessor's prompt, where
the predecessor's output would lie, are that answer, recomputed in the source system. The
rule, per request R2 in trace order (block size = the source's native one):

    R1   = the request, earlier in time and in R2's scope, whose whole block list is the
           longest prefix of R2's (the latest of equals); no fall back to a shorter one
    skip   when an earlier request continued R1's last block with another block (a shared
           system prompt that many conversations extend is no one's previous turn)
    skip   when R2's prompt is shorter than R1's prompt + R1's output
    cand = R2's blocks after R1's, up to (R1's prompt + R1's output tokens) // block size
    skip   when cand is empty, or holds a block seen before R2 (then it was not new output)
    skip   when R1 already has an answer (the first follower wins)
    R1's answer = cand

One parent per block holds by construction: cand's first block hangs from R1's last
block in R2's chain, as an answer's first block must, and cand is new at R2. A request no
later one ties (a conversation's last turn) gets no answer.
"""

from __future__ import annotations

RULE = ("answer of R1 = the blocks of R2 after R1's prompt blocks up to (R1 prompt + out "
        "tokens) // block_size, where R2 is the first later request (in R1's scope) whose "
        "blocks start with R1's whole block list as their longest such prefix, R1's last "
        "block is continued by no other block, R2's prompt holds at least R1's prompt and "
        "output tokens, and those blocks are first seen in R2")


def infer_answers(lines: list[dict], block_size: int) -> dict:
    """Fills ``answer`` on the request lines of ``lines`` (in time order) by the module's
    rule, in place; returns counts for the header (answered requests, answer blocks)."""
    reqs = [x for x in lines if x.get("op") == "request"]
    seen: set[str] = set()              # every block of a request before the current one
    ends: dict[str, list[int]] = {}     # a last block -> the requests ending there, in order
    child: dict[str, str] = {}          # a block -> the first block seen after it
    branched: set[str] = set()          # blocks continued by two different blocks
    num_answered = num_blocks = 0
    for j, r2 in enumerate(reqs):
        b2 = r2["blocks"]
        best = None
        for i in range(len(b2) - 1, -1, -1):          # the longest prefix first
            for k in reversed(ends.get(b2[i], ())):
                r1 = reqs[k]
                if r1["t"] < r2["t"] and r1["scope"] == r2["scope"]:
                    best = (r1, i + 1)
                    break
            if best is not None:
                break
        if best is not None:
            r1, n = best
            last = b2[n - 1]
            said = n * block_size + r1["tail"] + r1["out"]      # R1's prompt and output
            cand = b2[n:min(said // block_size, len(b2))]
            branch = last in branched or (cand and child.get(last, cand[0]) != cand[0])
            if (cand and not branch and len(b2) * block_size + r2["tail"] >= said
                    and not any(h in seen for h in cand) and "answer" not in r1):
                r1["answer"] = list(cand)
                num_answered += 1
                num_blocks += len(cand)
        prev = None
        for h in b2:
            seen.add(h)
            if prev is not None:
                c = child.setdefault(prev, h)
                if c != h:
                    branched.add(prev)
            prev = h
        for h in r2.get("answer", ()):
            seen.add(h)
        if b2:
            ends.setdefault(b2[-1], []).append(j)
    return {"answer_rule": RULE, "answered_requests": num_answered,
            "answer_blocks": num_blocks}
