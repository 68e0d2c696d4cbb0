"""explain --request / --block: which earlier decisions took a request's prefix, per
evicting group, in both runs; and one content's history, found by its trace hash."""

from __future__ import annotations

import csv
import hashlib
import json

import pytest

from test_cli import assert_one_line_error, psgate

REQ = "tenant-0-40"      # a victim request emptied under lru, kept under prefixshield


@pytest.fixture(scope="module")
def flood(tmp_path_factory):
    d = tmp_path_factory.mktemp("flood")
    trace = d / "flood.jsonl"
    assert psgate("trace", "gen", "tenant-flood", "-o", trace).returncode == 0
    plain = ["--ledger-compression", "none"]
    for name, extra in (("full", plain), ("evictions", ["--ledger-rows", "evictions", *plain]),
                        ("gzip", ["--ledger-compression", "gzip"]),
                        ("compact", ["--ledger-compression", "compact"]),
                        ("compact-evictions", ["--ledger-compression", "compact",
                                               "--ledger-rows", "evictions"])):
        proc = psgate("replay", "--trace", trace, "--baseline", "lru", "--candidate",
                      "prefixshield", "--capacity", "576", "--out", d / name, "--quiet",
                      *extra)
        assert proc.returncode == 0, proc.stderr
    return d


def trace_requests(path) -> dict[str, dict]:
    with open(path) as fh:
        return {o["id"]: o for o in map(json.loads, list(fh)[1:]) if o.get("op") == "request"}


def ledger(path, run: str) -> dict[int, dict]:
    with open(path, newline="") as fh:
        return {int(r["seq"]): r for r in csv.DictReader(fh) if r["run"] == run}


def blame(d, request=REQ, *more):
    proc = psgate("explain", d, "--request", request, "--json", *more)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout), proc.stderr


def test_request_names_the_evicting_group_with_exact_counts(flood):
    res, text = blame(flood / "full")
    assert res["full_blocks"] == 66 and res["group"] == "tenant-0"
    base, cand = res["runs"]["baseline"], res["runs"]["candidate"]
    assert (base["policy"], cand["policy"]) == ("lru", "prefixshield")
    assert (base["hits"], base["missed"], base["evicted"], base["never_cached"],
            base["resident_not_hit"]) == (0, 66, 64, 2, 0)
    assert [(b["group"], b["blocks"], b["requests"]) for b in base["blame"]] == [
        ("tenant-1", 42, ["tenant-1-41", "tenant-1-42"]), ("flooder", 22, ["x79"])]
    assert sum(b["blocks"] for b in base["blame"]) + base["never_cached"] \
        + base["resident_not_hit"] == base["missed"]
    assert [b["pos"] for b in base["blocks"] if b["status"] == "never_cached"] == [64, 65]
    assert (cand["hits"], cand["missed"], cand["never_cached"], cand["blame"]) == (64, 2, 2, [])
    assert base["ledger_consistent"] and cand["ledger_consistent"]
    # the admission's own evictions: a count and a range, not one paragraph each
    own = base["own_evictions"]
    assert (own["count"], own["decisions"][0], own["decisions"][-1]) == (66, 5497, 5562)
    assert own["by_owner"] == {"flooder": 22, "tenant-0": 3, "tenant-1": 41}
    lines = text.splitlines()
    assert len(lines) <= 40, text
    assert sum("5497" in ln for ln in lines) == 1
    joined = " ".join(ln.strip() for ln in lines)
    assert "42 of 66 missed blocks were evicted by tenant-1's requests tenant-1-41, " \
           "tenant-1-42" in joined
    assert "22 of 66 missed blocks were evicted by flooder's request x79" in joined
    assert "2 were never cached (blocks 64-65" in joined
    assert "baseline (lru): 0 of 66 blocks hit" in text
    assert "candidate (prefixshield): 64 of 66 blocks hit" in text


def test_the_plain_answer_fits_one_screen(flood):
    """Without --json: one screen on stdout naming who evicted the prefix in each run,
    instead of a paragraph per eviction of the request's own admission."""
    proc = psgate("explain", flood / "full", "--request", REQ, "--run", "baseline")
    assert proc.returncode == 0 and proc.stderr == ""
    lines = proc.stdout.splitlines()
    assert len(lines) <= 40 and max(map(len, lines)) <= 160, proc.stdout[:2000]
    assert "needed a block beyond the truly free ones" not in proc.stdout
    text = " ".join(ln.strip() for ln in lines)
    assert "42 of 66 missed blocks were evicted by tenant-1's requests tenant-1-41, " \
           "tenant-1-42 (decisions 4635-4679" in text
    at = next(i for i, ln in enumerate(lines) if ln.startswith("looked up at"))
    assert lines[at - 1].split() == ["baseline", "(lru)", "candidate", "(prefixshield)"]
    assert lines[at + 1].split() == ["hit", "0", "64"]
    assert "its own admission (decision 5563) evicted 66 blocks" in text


def test_blamed_decisions_are_the_last_evictions_in_the_ledger(flood):
    """Every blamed decision is a ledger eviction of that very content, and nothing
    evicted or cached the content again between it and the request's lookup."""
    res, _ = blame(flood / "full")
    base = res["runs"]["baseline"]
    rows = ledger(flood / "full" / "ledger.csv", "baseline")
    reqs = trace_requests(flood / "flood.jsonl")
    lookup = base["own_evictions"]["decisions"][0]
    assert rows[base["decision"]]["kind"] == "admit" and rows[base["decision"]]["hits"] == "0"
    for seq in base["own_evictions"]["decisions"]:
        assert rows[seq]["kind"] == "evict" and rows[seq]["request"] == REQ
    evicted = [b for b in base["blocks"] if b["status"] == "evicted"]
    assert len(evicted) == 64
    for b in evicted:
        e = b["eviction"]
        row = rows[e["decision"]]
        assert row["kind"] == "evict" and row["hash"] == b["hash"]
        assert row["owner"] == "tenant-0"
        assert (row["request"], row["group"], row["t"]) == (e["request"], e["group"], e["t"])
        assert int(row["position"]) == e["position"] and row["queue"] == e["queue"]
        for seq in range(e["decision"] + 1, lookup):
            r = rows[seq]
            assert not (r["kind"] == "evict" and r["hash"] == b["hash"])
            if r["kind"] == "admit":
                assert b["hash"] not in reqs[r["request"]]["blocks"], (b, seq)
    assert {b["eviction"]["group"] for b in evicted} == {"flooder", "tenant-1"}


def test_block_hash_shows_the_content_history_in_both_runs(flood):
    # a later victim of the same prefix: its eviction is among the events the text shows
    res, _ = blame(flood / "full", "tenant-0-53")
    b = next(b for b in res["runs"]["baseline"]["blocks"] if b["pos"] == 0)
    e = b["eviction"]
    proc = psgate("explain", flood / "full", "--block", b["hash"][:12], "--json")
    assert proc.returncode == 0, proc.stderr
    hist = json.loads(proc.stdout)
    assert hist["hash"] == b["hash"] and hist["groups"] == ["tenant-0"]
    base = hist["runs"]["baseline"]["groups"]["tenant-0"]
    cand = hist["runs"]["candidate"]["groups"]["tenant-0"]
    ev = [x for x in base["events"] if x["kind"] == "evicted"]
    assert e["decision"] in [x["decision"] for x in ev]
    assert next(x for x in ev if x["decision"] == e["decision"])["request"] == "tenant-0-52"
    assert base["evicted"] == len(ev) >= 1 and cand["evicted"] == 0
    assert cand["cached"] == 1 and cand["hits"] > base["hits"]
    rows = ledger(flood / "full" / "ledger.csv", "baseline")
    assert [s for s, r in rows.items() if r["kind"] == "evict" and r["hash"] == b["hash"]] \
        == [x["decision"] for x in ev]
    assert "baseline (lru), group tenant-0" in proc.stderr
    assert "candidate (prefixshield), group tenant-0" in proc.stderr
    assert f"decision {e['decision']}" in proc.stderr
    plain = psgate("explain", flood / "full", "--block", b["hash"])
    assert plain.returncode == 0 and plain.stdout == proc.stderr and plain.stderr == ""


LEDGER_FORMS = ("evictions", "gzip", "compact", "compact-evictions")


def test_evictions_only_gzip_and_compact_ledgers_give_the_same_answers(flood):
    full, _ = blame(flood / "full")
    for name in LEDGER_FORMS:
        other, _ = blame(flood / name)
        assert other == full, name
    h = full["runs"]["baseline"]["blocks"][10]["hash"]
    outs = {psgate("explain", flood / name, "--block", h, "--json").stdout
            for name in ("full",) + LEDGER_FORMS}
    assert len(outs) == 1 and json.loads(outs.pop())["runs"]["baseline"]["groups"]
    seq = next(k for k, r in ledger(flood / "full" / "ledger.csv", "candidate").items()
               if r["kind"] == "evict")
    decided = {psgate("explain", flood / name, "--decision", str(seq)).stdout
               for name in ("full", "gzip", "compact")}
    assert len(decided) == 1 and decided.pop().startswith(f"decision {seq} ")


def test_pool_slot_and_bad_selectors(flood):
    slot = ledger(flood / "full" / "ledger.csv", "candidate")[1580]["block"]
    proc = psgate("explain", flood / "full", "--slot", slot)
    assert proc.returncode == 0 and f"Victim: block {slot} " in proc.stdout
    assert_one_line_error(psgate("explain", flood / "full", "--request", "nobody"), 2,
                          "--request", "no request 'nobody'")
    assert_one_line_error(psgate("explain", flood / "full", "--block", "ffffffffffff0000"), 2,
                          "--block", "no block with trace hash")
    assert_one_line_error(psgate("explain", flood / "full", "--block", "0"), 2, "--block")
    assert_one_line_error(psgate("explain", flood / "full", "--request", REQ, "--decision",
                                 "3"), 2, "name one of")


def _h(*parts) -> str:
    return hashlib.blake2b("/".join(map(str, parts)).encode(), digest_size=16).hexdigest()


def test_names_from_the_trace_are_printed_as_they_are(tmp_path):
    """A group '[/bad]' and ids holding markup come out literally, with no crash."""
    prefix = [_h("p", i) for i in range(8)]
    lines = [{"psgate_trace": 1, "block_size": 16}]
    for i in range(6):
        lines.append({"t": i, "op": "request", "id": f"[red]v{i}", "group": "[/bad]",
                      "contract": "standard", "scope": "m", "blocks": prefix, "tail": 3,
                      "out": 4})
        lines.append({"t": i + 0.5, "op": "request", "id": f"f{i}", "group": "fl[b]",
                      "contract": "standard", "scope": "m",
                      "blocks": [_h("f", i, j) for j in range(10)], "tail": 3, "out": 4})
    trace = tmp_path / "bad.jsonl"
    trace.write_text("".join(json.dumps(x) + "\n" for x in lines))
    out = tmp_path / "o"
    assert psgate("replay", "--trace", trace, "--baseline", "lru", "--candidate", "lru",
                  "--capacity", 14, "--out", out, "--quiet",
                  "--allow-unexercised").returncode in (0, 1)
    proc = psgate("explain", out, "--request", "[red]v2")
    assert proc.returncode == 0, proc.stderr
    assert "request [red]v2 (group [/bad]" in proc.stdout
    assert "6 of 6 missed blocks were evicted by fl[b]'s request f1" in proc.stdout
    proc = psgate("explain", out, "--block", prefix[0], "--json")
    assert proc.returncode == 0, proc.stderr
    assert "cached by [red]v0" in proc.stderr
    assert json.loads(proc.stdout)["groups"] == ["[/bad]"]


def test_resident_blocks_that_were_not_hit_say_why(tmp_path):
    """A fully cached prompt recomputes its last block; a block behind the first miss
    stays resident yet unused (here s3fifo drops a prompt's first block)."""
    blocks = [_h("q", i) for i in range(4)]
    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps({"psgate_trace": 1, "block_size": 16}) + "\n" + "".join(
        json.dumps({"t": i, "op": "request", "id": f"r{i}", "group": "g",
                    "contract": "standard", "scope": "m", "blocks": blocks, "tail": 0,
                    "out": 4}) + "\n" for i in range(2)))
    assert psgate("replay", "--trace", trace, "--baseline", "lru", "--candidate", "lru",
                  "--out", tmp_path / "o", "--quiet", "--allow-unexercised").returncode in (0, 1)
    res, text = blame(tmp_path / "o", "r1")
    run = res["runs"]["candidate"]
    assert (run["hits"], run["resident_not_hit"]) == (3, 1)
    assert "last block is recomputed" in run["blocks"][3]["why"]
    sg = tmp_path / "sg.jsonl"
    assert psgate("trace", "gen", "sharegpt", "-o", sg, "--param",
                  "conversations=60").returncode == 0
    assert psgate("replay", "--trace", sg, "--baseline", "lru", "--candidate", "s3fifo",
                  "--capacity", 512, "--out", tmp_path / "s", "--quiet").returncode in (0, 1)
    res, text = blame(tmp_path / "s", "c9t4")
    s3, lru = res["runs"]["candidate"], res["runs"]["baseline"]
    assert (s3["hits"], s3["evicted"], s3["never_cached"], s3["resident_not_hit"]) \
        == (0, 60, 33, 15)
    assert [b["pos"] for b in s3["blocks"] if b["status"] == "resident_not_hit"] == \
        list(range(26, 41))
    assert s3["blocks"][0]["eviction"]["group"] == "tenant-2"
    assert lru["hits"] == 75
    assert "15 were resident but not hit (blocks 26-40: after the first miss (block 0))" in text
    assert s3["ledger_consistent"] and lru["ledger_consistent"]


def test_scopes_of_one_group_are_told_apart(tmp_path):
    """adapter-churn gives one tenant many scopes holding the same hashes: the blame
    replays the run for each victim's scope and still matches every admission's hits."""
    t = tmp_path / "ac.jsonl"
    assert psgate("trace", "gen", "adapter-churn", "-o", t, "--param",
                  "duration_s=20").returncode == 0
    out = tmp_path / "o"
    assert psgate("replay", "--trace", t, "--baseline", "lru", "--candidate",
                  "prefixshield", "--capacity", 256, "--out", out, "--quiet").returncode in (0, 1)
    with open(out / "requests.csv", newline="") as fh:
        rows = [r for r in csv.DictReader(fh) if r["run"] == "baseline"]
    missed = next(r["id"] for r in reversed(rows)
                  if r["state"] == "completed" and int(r["new_blocks"]) > 2)
    res, _ = blame(out, missed)
    for run in res["runs"].values():
        assert run["ledger_consistent"], run.get("mismatched_admissions")
        assert run["hits"] + run["missed"] == res["full_blocks"]
