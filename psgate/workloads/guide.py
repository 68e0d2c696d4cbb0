"""The practitioner guide's scenarios (block size 16, sized for 512 configured blocks).

Each scenario is a registered workload kind with its defaults fixed here (written,
with every parameter and a few derived figures, into the trace header's
``generator`` object). All are deterministic from ``seed``: every traffic class
draws from its own random stream, seeded by (kind, seed, class), so changing one
class's parameters does not reshuffle the others.

Conventions shared by every kind:

- Sizes are in tokens, as prompts are. A prompt is a shared prefix of
  ``*_prefix_tokens`` followed by a request-unique suffix; the prefix's full blocks
  are shared content, its remainder plus the suffix are unique blocks, and what is
  left over is the request's ``tail``. So a prefix shares exactly
  ``prefix_tokens // block_size`` blocks.
- ``prefix`` is the logical prefix label (the hot prompt a request re-reads, or a
  unique label for a one-off prompt); ``role`` is for metrics only: ``victim`` is
  the traffic whose hits the scenario is about, ``attacker`` the traffic that puts
  pressure on it (not necessarily malicious), ``benign`` everything else.
- Requests before ``warmup_s`` (tenant-flood: before the flood) carry
  ``measure: false``: they warm the cache and stay out of the metrics.
- Contracts are critical / standard / best-effort (psgate's default table); every
  group and its contract are declared in the header.

Kinds (defaults in the ``*_DEFAULTS`` dicts below):

steady             4 tenants x 2 hot 768-token system prompts (384 blocks, 75% of 511),
                   unique 16-64-token questions, Poisson arrivals (1.5/s per tenant),
                   no attacker. A baseline: a good policy should not lose to LRU here.
fanout             agent fan-out: bursts of 16 requests within 4 ms from one shared
                   1,024-token system prompt (64 blocks), each with its own 32-96-token
                   task, bursts ~3 s apart (Poisson); 2 background tenants re-read 12
                   384-token prompts each (576 blocks: more than the cache) at 4/s.
tenant-flood       2 victim tenants re-read 2 hot 1,024-token prompts each (256 blocks);
                   from 10 s to 30 s an attacker tenant sends 6 unseen 768-token
                   prompts per second (288 new blocks/s).
priority-expiry    retention hints for priority-lru (TensorRT-LLM style: lower priority
                   is evicted first; a block without a live hint gets priority-lru's
                   default, 35). Which requests carry which hint (PRIORITY_HINTS, also
                   written into the header's ``derived.hints``):
                     chat   (critical, victim): 2 hot 1,024-token prompts at 0.8/s,
                            ``priority`` 90 and no ``priority_until``: kept for good;
                     promo  (standard, benign): one 768-token campaign prompt at 1/s
                            until 25 s, ``priority`` 80 with ``priority_until`` 25.0
                            (absolute): the campaign ends and its hint expires mid-trace;
                     assist (standard, benign): two-turn sessions (0.5 new/s, 512-token
                            context, follow-up 1-10 s later), each turn ``priority`` 70
                            until its own t + 5 s: many follow-ups arrive after the
                            first turn's hint ended;
                     batch  (best-effort, attacker): unique 512-token prompts at 6/s with
                            no hint: the pressure the hints are meant to resist.
revision-rollover  3 tenants x 2 hot 768-token prompts on scope ``llm@rev-a``; at 30 s the
                   model revision rolls over and every later request uses ``llm@rev-b``.
                   The prompts' content and so their block hashes are unchanged (as a
                   redacted trace of the same text would be): only the scope tells the
                   old KV is useless, and a hit across it would be an invariant violation.
adapter-churn      32 LoRA adapters (one scope each, ``llm@rev-a+lora-NN``) over 4 tenants,
                   each with a 256-token hot prompt (16 blocks; 512 in all); 8 adapters
                   are active at a time and the window moves on by 4 every 6 s. By
                   default the adapters of one tenant share their system prompt's text
                   (equal hashes in different scopes, never shareable).
cancellation       2 chat tenants (2 hot 512-token prompts each, 3/s in all) plus bursts
                   (~6 s apart) of 5 long-document requests within 50 ms (1,536 unique
                   tokens, 128 output tokens: 104 blocks each, so a whole burst, 520
                   blocks, cannot fit in 511 and its last document waits, blocking the
                   line behind it as vLLM's FCFS scheduler does). 15% of requests are
                   cancelled 2-50 ms after arrival (while waiting for capacity, or
                   admitted and queued for prefill), 10% 0.5-5 s after (mid-decode, or
                   after completion: a late no-op), and the last document of each burst
                   is abandoned 20-200 ms after arrival (normally while it waits); 30% of
                   the chat requests that are not cancelled carry ``done_t`` (observed
                   completion 0.3-2 s after arrival). A request never has both.
cold               every prompt unique (128-1,024 tokens) from 3 tenants at 6/s: nothing
                   can ever hit; churn only.
"""

from __future__ import annotations

import math
import random

from psgate.contracts import CONTRACT_NAMES
from psgate.engines.cost import CostModel
from psgate.trace.writer import header_line
from psgate.workloads import register_generator
from psgate.workloads.common import (SYNTHETIC_HASHING, StepRates, c_prefill_rate, chain,
                                     fraction, header_params, need, nonneg, ordered, poisson,
                                     positive, rate_model, rate_provenance, request,
                                     resolve_params)


STEADY_DEFAULTS = {
    "seed": 0, "block_size": 16, "tenants": 4, "prompts_per_tenant": 2,
    "prefix_tokens": 768, "suffix_min_tokens": 16, "suffix_max_tokens": 64, "out": 64,
    "rate_per_tenant": 1.5, "duration_s": 60.0, "warmup_s": 5.0,
}

FANOUT_DEFAULTS = {
    "seed": 0, "block_size": 16, "fanout": 16, "burst_gap_s": 3.0, "burst_spread_ms": 4.0,
    "system_tokens": 1024, "task_min_tokens": 32, "task_max_tokens": 96, "fanout_out": 128,
    "background_tenants": 2, "background_prompts": 12, "background_prefix_tokens": 384,
    "background_suffix_tokens": 32, "background_rate": 4.0, "background_out": 32,
    "duration_s": 60.0, "warmup_s": 3.0,
}

TENANT_FLOOD_DEFAULTS = {
    "seed": 0, "block_size": 16, "victim_tenants": 2, "prompts_per_victim": 2,
    "victim_prefix_tokens": 1024, "victim_suffix_tokens": 32, "victim_rate": 1.5,
    "victim_out": 32, "flood_start_s": 10.0, "flood_end_s": 30.0, "flood_rate": 6.0,
    "flood_tokens": 768, "flood_out": 8, "duration_s": 40.0,
}

PRIORITY_EXPIRY_DEFAULTS = {
    "seed": 0, "block_size": 16, "duration_s": 60.0, "warmup_s": 3.0,
    "chat_prompts": 2, "chat_prefix_tokens": 1024, "chat_suffix_tokens": 32,
    "chat_rate": 0.8, "chat_out": 32, "chat_priority": 90,
    "promo_prefix_tokens": 768, "promo_suffix_tokens": 32, "promo_rate": 1.0,
    "promo_out": 32, "promo_priority": 80, "promo_end_s": 25.0,
    "session_rate": 0.5, "session_context_tokens": 512, "session_turn_tokens": 48,
    "session_followup_min_s": 1.0, "session_followup_max_s": 10.0,
    "session_retention_s": 5.0, "session_priority": 70, "session_out": 64,
    "batch_rate": 6.0, "batch_tokens": 512, "batch_out": 16,
}

PRIORITY_HINTS = {
    "chat": "victim (critical): priority chat_priority, no priority_until (held for the "
            "block's life)",
    "promo": "benign (standard): priority promo_priority until promo_end_s (absolute); "
             "promo traffic stops at promo_end_s, so its hint expires mid-trace",
    "assist": "benign (standard) two-turn sessions: each turn priority session_priority "
              "until its own t + session_retention_s; follow-ups come 1-10 s later, so some "
              "arrive after the first turn's hint has expired",
    "batch": "attacker (best-effort): one-off prompts with no hint (default priority)",
}

REVISION_ROLLOVER_DEFAULTS = {
    "seed": 0, "block_size": 16, "tenants": 3, "prompts_per_tenant": 2,
    "prefix_tokens": 768, "suffix_min_tokens": 16, "suffix_max_tokens": 64, "out": 32,
    "rate_per_tenant": 2.0, "rollover_s": 30.0, "duration_s": 60.0, "warmup_s": 3.0,
    "old_scope": "llm@rev-a", "new_scope": "llm@rev-b",
}

ADAPTER_CHURN_DEFAULTS = {
    "seed": 0, "block_size": 16, "tenants": 4, "adapters": 32, "prefix_tokens": 256,
    "shared_tenant_prompt": True, "active_adapters": 8, "cycle_step": 4, "cycle_s": 6.0,
    "rate": 8.0, "suffix_min_tokens": 16, "suffix_max_tokens": 48, "out": 32,
    "duration_s": 60.0, "warmup_s": 3.0, "base_scope": "llm@rev-a",
}

CANCELLATION_DEFAULTS = {
    "seed": 0, "block_size": 16, "duration_s": 60.0, "warmup_s": 2.0,
    "chat_tenants": 2, "chat_prompts": 2, "chat_prefix_tokens": 512,
    "chat_suffix_min_tokens": 16, "chat_suffix_max_tokens": 64, "chat_rate": 3.0,
    "chat_out": 64, "doc_burst": 5, "doc_burst_gap_s": 6.0, "doc_spread_ms": 50.0,
    "doc_tokens": 1536, "doc_out": 128, "early_cancel_frac": 0.15, "early_min_ms": 2.0,
    "early_max_ms": 50.0, "late_cancel_frac": 0.1, "late_min_s": 0.5, "late_max_s": 5.0,
    "abandon_min_ms": 20.0, "abandon_max_ms": 200.0, "done_t_frac": 0.3,
    "done_min_s": 0.3, "done_max_s": 2.0,
}

COLD_DEFAULTS = {
    "seed": 0, "block_size": 16, "tenants": 3, "rate": 6.0, "prompt_min_tokens": 128,
    "prompt_max_tokens": 1024, "out": 32, "duration_s": 30.0,
    # C_prefill (derived, reported only) from the per-request or the step model
    "rates": "service",
}


# -- helpers ---------------------------------------------------------------------

def _rng(kind: str, seed: int, cls: str) -> random.Random:
    # A str seed is hashed with SHA-512 by random.seed: stable across runs and versions.
    return random.Random(f"psgate-guide/{kind}/{seed}/{cls}")


def _t(x: float) -> float:
    return round(x, 6)


def _prompt(prefix: list[str], prefix_tokens: int, label: str, suffix_tokens: int,
            bs: int) -> tuple[list[str], int]:
    """Blocks and tail of a prompt: ``prefix`` (the shared full blocks of a
    ``prefix_tokens`` prefix), then unique content labelled ``label``."""
    rest = prefix_tokens % bs + suffix_tokens
    parent = prefix[-1] if prefix else None
    blocks = prefix + chain(label, rest // bs, parent=parent)
    return blocks, (rest % bs) or (0 if blocks else 1)   # never an empty prompt


def _hot(label: str, tokens: int, bs: int) -> list[str]:
    return chain(label, tokens // bs)


class _Events:
    """Events in time order; at equal times, in the order they were added."""

    def __init__(self) -> None:
        self._ev: list[tuple[float, int, dict]] = []

    def add(self, ev: dict) -> None:
        self._ev.append((ev["t"], len(self._ev), ev))

    def cancel(self, req: dict, at: float) -> None:
        ct = max(_t(at), _t(req["t"] + 1e-6))
        self.add({"t": ct, "op": "cancel", "id": req["id"]})

    def lines(self, header: dict) -> list[dict]:
        self._ev.sort(key=lambda e: (e[0], e[1]))
        return [header] + [e[2] for e in self._ev]


def _header(kind: str, p: dict, groups: dict[str, str], derived: dict) -> dict:
    return header_line(p["block_size"], hashing=SYNTHETIC_HASHING,
                       source=f"psgate workload {kind} (practitioner guide)",
                       generator={"name": kind, "params": p, "derived": derived},
                       groups={g: {"contracts": [c]} for g, c in groups.items()})


def _blocks(tokens: int, bs: int) -> int:
    return tokens // bs


# -- steady ------------------------------------------------------------------------

def _hot_reads(ev: "_Events", rng: random.Random, group: str, contract: str,
               hot: list[list[str]], label: str, prefix_tokens: int, suffix_tokens: int,
               out: int, rate: float, duration_s: float, role: str, measure_from: float,
               bs: int) -> None:
    """One tenant's Poisson stream over [0, duration_s) of re-reads of its hot prompts
    (uniform choice), each with a request-unique suffix; measured from ``measure_from``.
    Shared by fanout's background tenants and tenant-flood's victims."""
    for i, t in enumerate(poisson(rng, 0.0, duration_s, rate)):
        k = rng.randrange(len(hot))
        rid = f"{group}-{i}"
        blocks, tail = _prompt(hot[k], prefix_tokens, f"q/{rid}", suffix_tokens, bs)
        ev.add(request(t, rid, group, contract, blocks, tail, out,
                       f"{group}-{label}-{k}", role, measure=t >= measure_from))


def _hot_prompt_tenants(kind: str, p: dict, scope_of):
    """Tenants re-reading their own hot prompts with short unique questions, Poisson
    arrivals; the scope of each request is ``scope_of(t)``. Shared by steady and
    revision-rollover."""
    bs = p["block_size"]
    ev = _Events()
    groups = {}
    for g in range(p["tenants"]):
        group, contract = f"tenant-{g}", CONTRACT_NAMES[g % 3]
        groups[group] = contract
        hot = [_hot(f"{group}-sys-{k}", p["prefix_tokens"], bs)
               for k in range(p["prompts_per_tenant"])]
        rng = _rng(kind, p["seed"], group)
        for i, t in enumerate(poisson(rng, 0.0, p["duration_s"], p["rate_per_tenant"])):
            k = rng.randrange(p["prompts_per_tenant"])
            rid = f"{group}-{i}"
            n = rng.randint(p["suffix_min_tokens"], p["suffix_max_tokens"])
            blocks, tail = _prompt(hot[k], p["prefix_tokens"], f"q/{rid}", n, bs)
            ev.add(request(t, rid, group, contract, blocks, tail, p["out"], f"{group}-sys-{k}",
                           "benign", measure=t >= p["warmup_s"], scope=scope_of(t)))
    return ev, groups


@register_generator("steady", "tenants re-read stable hot system prompts at steady Poisson "
                    "rates, no attacker (a no-regression baseline)", STEADY_DEFAULTS)
def steady(**overrides) -> list[dict]:
    kind = "steady"
    p = resolve_params(kind, STEADY_DEFAULTS, overrides)
    positive(kind, p, "block_size", "tenants", "prompts_per_tenant", "prefix_tokens",
             "rate_per_tenant", "duration_s")
    nonneg(kind, p, "suffix_min_tokens", "out", "warmup_s")
    ordered(kind, p, "suffix_min_tokens", "suffix_max_tokens")
    bs = p["block_size"]
    ev, groups = _hot_prompt_tenants(kind, p, lambda t: "m")
    derived = {"working_set_blocks": p["tenants"] * p["prompts_per_tenant"]
               * _blocks(p["prefix_tokens"], bs)}
    return ev.lines(_header(kind, p, groups, derived))


# -- fanout ------------------------------------------------------------------------

@register_generator("fanout", "synchronized agent fan-out: bursts of requests from one shared "
                    "system prompt within a few ms, plus background tenants", FANOUT_DEFAULTS)
def fanout(**overrides) -> list[dict]:
    kind = "fanout"
    p = resolve_params(kind, FANOUT_DEFAULTS, overrides)
    positive(kind, p, "block_size", "fanout", "burst_gap_s", "system_tokens", "duration_s",
             "background_prompts", "background_prefix_tokens")
    nonneg(kind, p, "burst_spread_ms", "task_min_tokens", "fanout_out", "background_tenants",
           "background_suffix_tokens", "background_rate", "background_out", "warmup_s")
    ordered(kind, p, "task_min_tokens", "task_max_tokens")
    bs = p["block_size"]
    ev = _Events()
    groups = {"agents": "standard"}
    system = _hot("agents-sys", p["system_tokens"], bs)
    rng = _rng(kind, p["seed"], "agents")
    bursts = 0
    for b, t0 in enumerate(poisson(rng, 0.0, p["duration_s"], 1.0 / p["burst_gap_s"])):
        bursts += 1
        offsets = sorted(rng.uniform(0.0, p["burst_spread_ms"] / 1000.0)
                         for _ in range(p["fanout"]))
        for j, dt in enumerate(offsets):
            rid = f"f{b}-{j}"
            n = rng.randint(p["task_min_tokens"], p["task_max_tokens"])
            blocks, tail = _prompt(system, p["system_tokens"], f"task/{rid}", n, bs)
            ev.add(request(t0 + dt, rid, "agents", "standard", blocks, tail,
                           p["fanout_out"], "agents-sys", "victim",
                           measure=t0 >= p["warmup_s"]))
    for g in range(p["background_tenants"]):
        group, contract = f"bg-{g}", CONTRACT_NAMES[(g + 1) % 3]
        groups[group] = contract
        hot = [_hot(f"{group}-doc-{k}", p["background_prefix_tokens"], bs)
               for k in range(p["background_prompts"])]
        rng = _rng(kind, p["seed"], group)
        rate = p["background_rate"] / p["background_tenants"]
        if rate <= 0:
            continue
        _hot_reads(ev, rng, group, contract, hot, "doc", p["background_prefix_tokens"],
                   p["background_suffix_tokens"], p["background_out"], rate, p["duration_s"],
                   "benign", p["warmup_s"], bs)
    derived = {"bursts": bursts,
               "system_blocks": _blocks(p["system_tokens"], bs),
               "background_working_set_blocks": p["background_tenants"]
               * p["background_prompts"] * _blocks(p["background_prefix_tokens"], bs)}
    return ev.lines(_header(kind, p, groups, derived))


# -- tenant-flood ------------------------------------------------------------------

@register_generator("tenant-flood", "one tenant floods unseen prefixes while others keep hot "
                    "prompts", TENANT_FLOOD_DEFAULTS)
def tenant_flood(**overrides) -> list[dict]:
    kind = "tenant-flood"
    p = resolve_params(kind, TENANT_FLOOD_DEFAULTS, overrides)
    positive(kind, p, "block_size", "victim_tenants", "prompts_per_victim", "victim_prefix_tokens",
             "victim_rate", "flood_tokens", "duration_s")
    nonneg(kind, p, "victim_suffix_tokens", "victim_out", "flood_start_s", "flood_rate",
           "flood_out")
    ordered(kind, p, "flood_start_s", "flood_end_s")
    bs = p["block_size"]
    ev = _Events()
    groups = {}
    for g in range(p["victim_tenants"]):
        group, contract = f"tenant-{g}", ("critical", "standard")[g % 2]
        groups[group] = contract
        hot = [_hot(f"{group}-sys-{k}", p["victim_prefix_tokens"], bs)
               for k in range(p["prompts_per_victim"])]
        rng = _rng(kind, p["seed"], group)
        _hot_reads(ev, rng, group, contract, hot, "sys", p["victim_prefix_tokens"],
                   p["victim_suffix_tokens"], p["victim_out"], p["victim_rate"],
                   p["duration_s"], "victim", p["flood_start_s"], bs)
    groups["flooder"] = "best-effort"
    rng = _rng(kind, p["seed"], "flooder")
    n_flood = 0
    if p["flood_rate"] > 0:
        for i, t in enumerate(poisson(rng, p["flood_start_s"], p["flood_end_s"],
                                      p["flood_rate"])):
            n_flood += 1
            rid = f"x{i}"
            blocks, tail = _prompt([], 0, f"flood/{rid}", p["flood_tokens"], bs)
            ev.add(request(t, rid, "flooder", "best-effort", blocks, tail,
                           p["flood_out"], f"flood-{i}", "attacker"))
    victim_ws = (p["victim_tenants"] * p["prompts_per_victim"]
                 * _blocks(p["victim_prefix_tokens"], bs))
    derived = {"victim_working_set_blocks": victim_ws, "flood_requests": n_flood,
               "flood_new_blocks_per_s": round(p["flood_rate"] * p["flood_tokens"] / bs, 6)}
    return ev.lines(_header(kind, p, groups, derived))


# -- priority-expiry ---------------------------------------------------------------

@register_generator("priority-expiry", "retention hints (priority, priority_until) for "
                    "priority-lru, some expiring mid-trace", PRIORITY_EXPIRY_DEFAULTS)
def priority_expiry(**overrides) -> list[dict]:
    kind = "priority-expiry"
    p = resolve_params(kind, PRIORITY_EXPIRY_DEFAULTS, overrides)
    positive(kind, p, "block_size", "duration_s", "chat_prompts", "chat_prefix_tokens",
             "promo_prefix_tokens", "session_context_tokens", "batch_tokens")
    nonneg(kind, p, "warmup_s", "chat_suffix_tokens", "chat_rate", "chat_out",
           "promo_suffix_tokens", "promo_rate", "promo_out", "promo_end_s", "session_rate",
           "session_turn_tokens", "session_followup_min_s", "session_retention_s",
           "session_out", "batch_rate", "batch_out")
    ordered(kind, p, "session_followup_min_s", "session_followup_max_s")
    bs = p["block_size"]
    ev = _Events()
    seed = p["seed"]
    warm = p["warmup_s"]
    groups = {"chat": "critical", "promo": "standard", "assist": "standard",
              "batch": "best-effort"}

    chat = [_hot(f"chat-sys-{k}", p["chat_prefix_tokens"], bs) for k in range(p["chat_prompts"])]
    rng = _rng(kind, seed, "chat")
    if p["chat_rate"] > 0:
        for i, t in enumerate(poisson(rng, 0.0, p["duration_s"], p["chat_rate"])):
            k = rng.randrange(p["chat_prompts"])
            rid = f"c{i}"
            blocks, tail = _prompt(chat[k], p["chat_prefix_tokens"], f"q/{rid}",
                                   p["chat_suffix_tokens"], bs)
            ev.add(request(t, rid, "chat", "critical", blocks, tail, p["chat_out"],
                           f"chat-sys-{k}", "victim", measure=t >= warm,
                           priority=p["chat_priority"]))

    promo = _hot("promo-sys", p["promo_prefix_tokens"], bs)
    rng = _rng(kind, seed, "promo")
    end = min(p["promo_end_s"], p["duration_s"])
    if p["promo_rate"] > 0 and end > 0:
        for i, t in enumerate(poisson(rng, 0.0, end, p["promo_rate"])):
            rid = f"p{i}"
            blocks, tail = _prompt(promo, p["promo_prefix_tokens"], f"q/{rid}",
                                   p["promo_suffix_tokens"], bs)
            ev.add(request(t, rid, "promo", "standard", blocks, tail, p["promo_out"],
                           "promo-sys", "benign", measure=t >= warm,
                           priority=p["promo_priority"], priority_until=_t(p["promo_end_s"])))

    rng = _rng(kind, seed, "assist")
    n_sessions = n_late_followups = 0
    if p["session_rate"] > 0:
        for i, t in enumerate(poisson(rng, 0.0, p["duration_s"], p["session_rate"])):
            n_sessions += 1
            context = chain(f"session-{i}/context", p["session_context_tokens"] // bs)
            first, tail1 = _prompt(context, p["session_context_tokens"], f"session-{i}/turn-0",
                                   0, bs)
            until1 = _t(t + p["session_retention_s"])
            ev.add(request(t, f"s{i}-0", "assist", "standard", first, tail1,
                           p["session_out"], f"session-{i}", "benign", measure=t >= warm,
                           priority=p["session_priority"], priority_until=until1))
            t2 = t + rng.uniform(p["session_followup_min_s"], p["session_followup_max_s"])
            if t2 >= p["duration_s"]:
                continue
            # The follow-up re-reads the context (its full blocks) and adds its turn.
            second, tail2 = _prompt(context, p["session_context_tokens"],
                                    f"session-{i}/turn-1", p["session_turn_tokens"], bs)
            if _t(t2) >= until1:
                n_late_followups += 1
            ev.add(request(t2, f"s{i}-1", "assist", "standard", second, tail2,
                           p["session_out"], f"session-{i}", "benign", measure=t2 >= warm,
                           priority=p["session_priority"],
                           priority_until=_t(t2 + p["session_retention_s"])))

    rng = _rng(kind, seed, "batch")
    if p["batch_rate"] > 0:
        for i, t in enumerate(poisson(rng, 0.0, p["duration_s"], p["batch_rate"])):
            rid = f"b{i}"
            blocks, tail = _prompt([], 0, f"batch/{rid}", p["batch_tokens"], bs)
            ev.add(request(t, rid, "batch", "best-effort", blocks, tail, p["batch_out"],
                           f"batch-{i}", "attacker", measure=t >= warm))
    derived = {"hints": PRIORITY_HINTS, "sessions": n_sessions,
               "followups_after_hint_expired": n_late_followups,
               "protected_blocks": p["chat_prompts"] * _blocks(p["chat_prefix_tokens"], bs)
               + _blocks(p["promo_prefix_tokens"], bs)}
    return ev.lines(_header(kind, p, groups, derived))


# -- revision-rollover -------------------------------------------------------------

@register_generator("revision-rollover", "the model revision (scope) changes mid-trace: "
                    "old KV becomes useless", REVISION_ROLLOVER_DEFAULTS)
def revision_rollover(**overrides) -> list[dict]:
    kind = "revision-rollover"
    p = resolve_params(kind, REVISION_ROLLOVER_DEFAULTS, overrides)
    positive(kind, p, "block_size", "tenants", "prompts_per_tenant", "prefix_tokens",
             "rate_per_tenant", "duration_s")
    nonneg(kind, p, "suffix_min_tokens", "out", "rollover_s", "warmup_s")
    ordered(kind, p, "suffix_min_tokens", "suffix_max_tokens")
    need(kind, p["old_scope"] != p["new_scope"], "new_scope", "a scope other than old_scope",
         p["new_scope"])
    bs = p["block_size"]
    # The same text under both revisions: equal hashes, different scopes.
    ev, groups = _hot_prompt_tenants(
        kind, p, lambda t: p["new_scope"] if _t(t) >= p["rollover_s"] else p["old_scope"])
    ws = p["tenants"] * p["prompts_per_tenant"] * _blocks(p["prefix_tokens"], bs)
    derived = {"working_set_blocks_per_scope": ws}
    return ev.lines(_header(kind, p, groups, derived))


# -- adapter-churn -----------------------------------------------------------------

def adapter_scope(base: str, k: int) -> str:
    return f"{base}+lora-{k:02d}"


@register_generator("adapter-churn", "many LoRA adapters (one scope each) with small hot "
                    "prompts; the active set cycles", ADAPTER_CHURN_DEFAULTS)
def adapter_churn(**overrides) -> list[dict]:
    kind = "adapter-churn"
    p = resolve_params(kind, ADAPTER_CHURN_DEFAULTS, overrides)
    positive(kind, p, "block_size", "tenants", "adapters", "prefix_tokens", "active_adapters",
             "cycle_s", "rate", "duration_s")
    nonneg(kind, p, "cycle_step", "suffix_min_tokens", "out", "warmup_s")
    ordered(kind, p, "suffix_min_tokens", "suffix_max_tokens")
    need(kind, p["active_adapters"] <= p["adapters"], "active_adapters",
         f"at most adapters ({p['adapters']})", p["active_adapters"])
    bs = p["block_size"]
    n = p["adapters"]
    tenants = min(p["tenants"], n)
    groups = {f"tenant-{g}": CONTRACT_NAMES[g % 3] for g in range(tenants)}
    prompts = []
    for k in range(n):
        label = f"tenant-{k % tenants}-sys" if p["shared_tenant_prompt"] else f"lora-{k:02d}-sys"
        prompts.append(_hot(label, p["prefix_tokens"], bs))
    rng = _rng(kind, p["seed"], "requests")
    ev = _Events()
    for i, t in enumerate(poisson(rng, 0.0, p["duration_s"], p["rate"])):
        c = math.floor(t / p["cycle_s"])
        k = (c * p["cycle_step"] + rng.randrange(p["active_adapters"])) % n
        group = f"tenant-{k % tenants}"
        rid = f"r{i}"
        m = rng.randint(p["suffix_min_tokens"], p["suffix_max_tokens"])
        blocks, tail = _prompt(prompts[k], p["prefix_tokens"], f"q/{rid}", m, bs)
        ev.add(request(t, rid, group, groups[group], blocks, tail, p["out"], f"lora-{k:02d}-sys",
                       "benign", measure=t >= p["warmup_s"],
                       scope=adapter_scope(p["base_scope"], k)))
    derived = {"adapter_working_set_blocks": n * _blocks(p["prefix_tokens"], bs),
               "cycles": math.ceil(p["duration_s"] / p["cycle_s"])}
    return ev.lines(_header(kind, p, groups, derived))


# -- cancellation ------------------------------------------------------------------

@register_generator("cancellation", "chat plus bursts of long documents, with cancels soon "
                    "after arrival and much later, and observed done_t", CANCELLATION_DEFAULTS)
def cancellation(**overrides) -> list[dict]:
    kind = "cancellation"
    p = resolve_params(kind, CANCELLATION_DEFAULTS, overrides)
    positive(kind, p, "block_size", "duration_s", "chat_tenants", "chat_prompts",
             "chat_prefix_tokens", "doc_burst_gap_s", "doc_tokens")
    nonneg(kind, p, "warmup_s", "chat_suffix_min_tokens", "chat_rate", "chat_out", "doc_burst",
           "doc_spread_ms", "doc_out", "early_min_ms", "late_min_s", "abandon_min_ms",
           "done_min_s")
    ordered(kind, p, "chat_suffix_min_tokens", "chat_suffix_max_tokens")
    ordered(kind, p, "early_min_ms", "early_max_ms")
    ordered(kind, p, "late_min_s", "late_max_s")
    ordered(kind, p, "abandon_min_ms", "abandon_max_ms")
    ordered(kind, p, "done_min_s", "done_max_s")
    fraction(kind, p, "early_cancel_frac", "late_cancel_frac", "done_t_frac")
    need(kind, p["early_cancel_frac"] + p["late_cancel_frac"] <= 1, "late_cancel_frac",
         "early_cancel_frac + late_cancel_frac <= 1", p["late_cancel_frac"])
    bs = p["block_size"]
    seed = p["seed"]
    warm = p["warmup_s"]
    ev = _Events()
    fate = _rng(kind, seed, "fate")
    counts = {"early_cancels": 0, "late_cancels": 0, "abandoned": 0, "done_t": 0}

    def add(req: dict, chat: bool) -> None:
        ev.add(req)
        r = fate.random()
        if r < p["early_cancel_frac"]:
            counts["early_cancels"] += 1
            ev.cancel(req, req["t"] + fate.uniform(p["early_min_ms"], p["early_max_ms"]) / 1000)
        elif r < p["early_cancel_frac"] + p["late_cancel_frac"]:
            counts["late_cancels"] += 1
            ev.cancel(req, req["t"] + fate.uniform(p["late_min_s"], p["late_max_s"]))
        elif chat and fate.random() < p["done_t_frac"]:
            counts["done_t"] += 1
            req["done_t"] = _t(req["t"] + fate.uniform(p["done_min_s"], p["done_max_s"]))

    groups = {}
    chat_rng = _rng(kind, seed, "chat")
    hot = {}
    for g in range(p["chat_tenants"]):
        groups[f"chat-{g}"] = ("critical", "standard")[g % 2]
        for k in range(p["chat_prompts"]):
            hot[g, k] = _hot(f"chat-{g}-sys-{k}", p["chat_prefix_tokens"], bs)
    arrivals = []
    if p["chat_rate"] > 0:
        for i, t in enumerate(poisson(chat_rng, 0.0, p["duration_s"], p["chat_rate"])):
            g = chat_rng.randrange(p["chat_tenants"])
            k = chat_rng.randrange(p["chat_prompts"])
            n = chat_rng.randint(p["chat_suffix_min_tokens"], p["chat_suffix_max_tokens"])
            arrivals.append((_t(t), 0, i, g, k, n))
    groups["docs"] = "best-effort"
    doc_rng = _rng(kind, seed, "docs")
    bursts = 0
    for b, t0 in enumerate(poisson(doc_rng, 0.0, p["duration_s"], 1.0 / p["doc_burst_gap_s"])):
        bursts += 1
        offs = sorted(doc_rng.uniform(0.0, p["doc_spread_ms"] / 1000)
                      for _ in range(p["doc_burst"]))
        for j, dt in enumerate(offs):
            arrivals.append((_t(t0 + dt), 1, b, j, 0, 0))
    # Fates are drawn in arrival order so the trace reads like a log written as it happened.
    arrivals.sort()
    for t, cls, a, b, c, d in arrivals:
        if cls == 0:
            i, g, k, n = a, b, c, d
            rid = f"c{i}"
            blocks, tail = _prompt(hot[g, k], p["chat_prefix_tokens"], f"q/{rid}", n, bs)
            add(request(t, rid, f"chat-{g}", groups[f"chat-{g}"], blocks, tail,
                        p["chat_out"], f"chat-{g}-sys-{k}", "victim", measure=t >= warm),
                chat=True)
        else:
            bi, j = a, b
            rid = f"d{bi}-{j}"
            blocks, tail = _prompt([], 0, f"doc/{rid}", p["doc_tokens"], bs)
            req = request(t, rid, "docs", "best-effort", blocks, tail, p["doc_out"],
                          f"doc-{bi}-{j}", "benign", measure=t >= warm)
            if j == p["doc_burst"] - 1 and p["doc_burst"] > 1:
                # The burst's last document does not fit beside the others: it waits,
                # and its user gives up while it does.
                ev.add(req)
                counts["abandoned"] += 1
                ev.cancel(req, t + fate.uniform(p["abandon_min_ms"],
                                                p["abandon_max_ms"]) / 1000)
            else:
                add(req, chat=False)
    doc_blocks = math.ceil((p["doc_tokens"] + p["doc_out"]) / bs)
    derived = {"doc_bursts": bursts, "blocks_per_doc_request": doc_blocks, **counts}
    return ev.lines(_header(kind, p, groups, derived))


# -- cold ----------------------------------------------------------------------------

@register_generator("cold", "no reuse at all: every prompt unique, nothing can hit",
                    COLD_DEFAULTS, uses_cost=True)
def cold(cost: CostModel | StepRates | None = None, **overrides) -> list[dict]:
    kind = "cold"
    p = resolve_params(kind, COLD_DEFAULTS, overrides)
    positive(kind, p, "block_size", "tenants", "rate", "prompt_min_tokens", "duration_s")
    nonneg(kind, p, "out")
    ordered(kind, p, "prompt_min_tokens", "prompt_max_tokens")
    bs = p["block_size"]
    groups = {f"tenant-{g}": CONTRACT_NAMES[g % 3] for g in range(p["tenants"])}
    rng = _rng(kind, p["seed"], "requests")
    ev = _Events()
    for i, t in enumerate(poisson(rng, 0.0, p["duration_s"], p["rate"])):
        g = rng.randrange(p["tenants"])
        rid = f"r{i}"
        n = rng.randint(p["prompt_min_tokens"], p["prompt_max_tokens"])
        blocks, tail = _prompt([], 0, f"cold/{rid}", n, bs)
        ev.add(request(t, rid, f"tenant-{g}", groups[f"tenant-{g}"], blocks, tail,
                       p["out"], f"cold-{i}", "benign"))
    model = rate_model(kind, p, cost)
    c_prefill, measured = c_prefill_rate(
        model, (p["prompt_min_tokens"] + p["prompt_max_tokens"]) // 2, p["out"], bs, 512)
    derived = {"c_prefill_per_s": round(c_prefill, 6), **rate_provenance(model, measured)}
    return ev.lines(_header(kind, header_params(p), groups, derived))
