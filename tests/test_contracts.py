"""Contracts files: parsed to the exact table, every bad input refused as one InputError
naming the file and the field, written by dumps_contracts and read back unchanged, and
applied to a trace's requests (relabelled) and to a policy's parameters."""

from __future__ import annotations

import dataclasses
import hashlib
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from psgate.contracts import (DEFAULT_CONTRACTS, ContractsFile, contracts_params,
                              dumps_contracts, group_contract, load_contracts,
                              parse_contracts)
from psgate.errors import EXIT_BAD_INPUT, InputError
from psgate.policies import policy_class
from psgate.trace.model import CancelEvent, RequestEvent

PATH = "c.toml"
CLASSES = """\
version = 1
default = "bulk"

[classes]
bulk = { refill = 4.0, burst = 32.0 }
gold = { refill = 64, burst = 256 }
"""
VALID = CLASSES + """
[[groups]]
name = "tenant-a"
refill = 12.5
burst = 300.0

[[groups]]
name = "tenant b"
refill = 1
burst = 1
"""


def group(name="a", refill="1.0", burst="2.0", extra="") -> str:
    return f'\n[[groups]]\nname = "{name}"\nrefill = {refill}\nburst = {burst}\n{extra}'


def refused(text: str) -> InputError:
    with pytest.raises(InputError) as exc:
        parse_contracts(text, PATH)
    assert exc.value.path == PATH and exc.value.exit_code == EXIT_BAD_INPUT
    assert str(exc.value).startswith(f"{PATH}: ")
    return exc.value


# -- parsing ------------------------------------------------------------------------------

def test_valid_file_parses_to_the_exact_table():
    f = parse_contracts(VALID, PATH, "ab" * 32)
    assert f == ContractsFile(PATH, "ab" * 32, "bulk",
                              {"bulk": [4.0, 32.0], "gold": [64.0, 256.0]},
                              {"tenant-a": [12.5, 300.0], "tenant b": [1.0, 1.0]})
    assert f.table() == {"bulk": [4.0, 32.0], "gold": [64.0, 256.0],
                         "@tenant-a": [12.5, 300.0], "@tenant b": [1.0, 1.0]}
    assert list(f.table()) == ["bulk", "gold", "@tenant-a", "@tenant b"]
    # TOML integers are read as floats, as receipts record them
    assert all(type(x) is float for v in f.table().values() for x in v)
    assert f.default == "bulk"
    assert f.contract_of("tenant-a") == "@tenant-a"
    assert f.contract_of("tenant b") == "@tenant b"
    assert f.contract_of("tenant-c") == "bulk"
    assert f.contract_of("@tenant-a") == "bulk"
    assert group_contract("tenant-a") == "@tenant-a"
    assert f.to_json() == {"path": PATH, "sha256": "ab" * 32, "default": "bulk",
                           "num_groups": 2}


def test_absent_classes_are_the_built_in_ones():
    f = parse_contracts('version = 1\ndefault = "standard"\n' + group("g", "3", "4"), PATH)
    assert f.classes == DEFAULT_CONTRACTS
    assert f.classes is not DEFAULT_CONTRACTS
    assert all(f.classes[k] is not DEFAULT_CONTRACTS[k] for k in f.classes)
    assert f.default == "standard" and f.sha256 == ""
    assert f.groups == {"g": [3.0, 4.0]}
    assert f.table() == {**DEFAULT_CONTRACTS, "@g": [3.0, 4.0]}
    assert f.contract_of("other") == "standard"


def test_a_file_without_groups_charges_everyone_to_the_default():
    f = parse_contracts(CLASSES, PATH)
    assert f.groups == {}
    assert f.table() == {"bulk": [4.0, 32.0], "gold": [64.0, 256.0]}
    assert f.contract_of("tenant-a") == "bulk"
    assert f.to_json()["num_groups"] == 0


# -- bad input: one InputError naming the file and the field -------------------------------

def test_a_group_named_twice_names_the_first_index():
    e = refused(CLASSES + group("a") + group("b") + group("a"))
    assert e.field == "groups[2].name"
    assert str(e) == ("c.toml: field 'groups[2].name': group 'a' is named twice "
                      "(first in groups[0])")


def test_a_negative_refill():
    e = refused(CLASSES + group("x") + group("a", refill="-1"))
    assert str(e) == ("c.toml: field 'groups[1].refill': expected a finite refill > 0 "
                      "blocks per second, found -1")


@pytest.mark.parametrize("refill, shown", [("0", "0"), ("0.0", "0.0"), ("-0.5", "-0.5"),
                                           ("nan", "nan"), ("inf", "inf"), ("-inf", "-inf"),
                                           ("true", "True"), ('"1"', "'1'"), ("[1]", "[1]")])
def test_a_refill_that_is_not_a_finite_positive_number(refill, shown):
    e = refused(CLASSES + group("a", refill=refill))
    assert e.field == "groups[0].refill"
    assert str(e) == ("c.toml: field 'groups[0].refill': expected a finite refill > 0 "
                      f"blocks per second, found {shown}")


@pytest.mark.parametrize("burst, shown", [("0.5", "0.5"), ("0", "0"), ("0.999", "0.999"),
                                          ("nan", "nan"), ("inf", "inf"), ("false", "False")])
def test_a_burst_under_one_block(burst, shown):
    e = refused(CLASSES + group("a", burst=burst))
    assert str(e) == ("c.toml: field 'groups[0].burst': expected a finite burst of at "
                      f"least 1 block, found {shown}")


def test_an_integer_too_large_for_a_float():
    e = refused(CLASSES + group("a", refill="1" + "0" * 400))
    assert e.field == "groups[0].refill"
    assert str(e).endswith("found an integer of 401 digits")


def test_a_burst_of_exactly_one_and_a_tiny_refill_are_accepted():
    f = parse_contracts(CLASSES + group("a", refill="1e-300", burst="1"), PATH)
    assert f.groups == {"a": [1e-300, 1.0]}


def test_a_class_is_checked_as_a_group_is():
    e = refused(CLASSES.replace("refill = 4.0", "refill = nan"))
    assert str(e) == ("c.toml: field 'classes.bulk.refill': expected a finite refill > 0 "
                      "blocks per second, found nan")
    e = refused(CLASSES.replace("burst = 32.0", "burst = 0.5"))
    assert e.field == "classes.bulk.burst"


def test_a_missing_refill_or_burst():
    e = refused(CLASSES + '\n[[groups]]\nname = "a"\nburst = 2.0\n')
    assert str(e) == "c.toml: field 'groups[0].refill': missing"
    e = refused(CLASSES + '\n[[groups]]\nname = "a"\nrefill = 2.0\n')
    assert str(e) == "c.toml: field 'groups[0].burst': missing"
    e = refused(CLASSES.replace(", burst = 32.0", ""))
    assert str(e) == "c.toml: field 'classes.bulk.burst': missing"


def test_a_group_without_a_name():
    e = refused(CLASSES + '\n[[groups]]\nrefill = 1.0\nburst = 2.0\n')
    assert str(e) == "c.toml: field 'groups[0].name': expected a non-empty group name, found None"
    e = refused(CLASSES + group(""))
    assert str(e) == "c.toml: field 'groups[0].name': expected a non-empty group name, found ''"
    e = refused(CLASSES + "\n[[groups]]\nname = 3\nrefill = 1.0\nburst = 2.0\n")
    assert e.field == "groups[0].name"


def test_an_unknown_key_at_top_level():
    e = refused(CLASSES.replace("version = 1\n", "version = 1\ncolour = 3\n"))
    assert e.field == "colour"
    assert str(e) == ("c.toml: field 'colour': unknown key (expected version, default, "
                      "classes, groups)")


def test_an_unknown_key_inside_a_group():
    e = refused(CLASSES + group("a") + group("b", extra='colour = "red"\n'))
    assert e.field == "groups[1]"
    assert str(e) == ("c.toml: field 'groups[1]': unknown key 'colour' (expected refill "
                      "and burst)")


@pytest.mark.parametrize("version, shown", [("2", "2"), ("0", "0"), ('"1"', "'1'"),
                                            ("[1]", "[1]"), (None, "None")])
def test_a_version_that_is_not_1(version, shown):
    text = CLASSES.replace("version = 1\n", "" if version is None else f"version = {version}\n")
    e = refused(text)
    assert str(e) == f"c.toml: field 'version': expected 1, found {shown}"


def test_a_default_that_names_no_class():
    e = refused(CLASSES.replace('default = "bulk"', 'default = "silver"'))
    assert str(e) == ("c.toml: field 'default': expected the name of a class (bulk, gold), "
                      "found 'silver'")
    e = refused(CLASSES.replace('default = "bulk"\n', ""))
    assert str(e) == ("c.toml: field 'default': expected the name of a class (bulk, gold), "
                      "found None")
    # the built-in classes when [classes] is absent: a group's own contract is no class
    e = refused('version = 1\ndefault = "@a"\n' + group("a"))
    assert e.field == "default"


def test_a_class_named_like_a_group_contract():
    e = refused(CLASSES + '"@x" = { refill = 1.0, burst = 2.0 }\n')
    assert str(e) == ("c.toml: field 'classes.@x': a class name must be non-empty and not "
                      "start with '@', found '@x'")
    e = refused(CLASSES + '"" = { refill = 1.0, burst = 2.0 }\n')
    assert e.field == "classes."


def test_classes_that_are_empty_or_not_tables():
    e = refused('version = 1\ndefault = "bulk"\n[classes]\n')
    assert str(e) == "c.toml: field 'classes': expected a table of one or more classes"
    e = refused('version = 1\ndefault = "bulk"\nclasses = 3\n')
    assert e.field == "classes"
    e = refused(CLASSES + "silver = 3\n")
    assert str(e) == ("c.toml: field 'classes.silver': expected a table with refill and "
                      "burst, found int")


def test_groups_that_are_not_an_array_of_tables():
    e = refused(CLASSES.replace("[classes]", "groups = 3\n\n[classes]"))
    assert str(e) == "c.toml: field 'groups': expected an array of tables ([[groups]])"
    e = refused(CLASSES.replace("[classes]", "groups = [3]\n\n[classes]"))
    assert e.field == "groups[0].name"


def test_text_that_is_not_toml():
    e = refused("this is = = not toml")
    assert e.field is None
    assert str(e).startswith("c.toml: not TOML (")
    e = refused(VALID + "[[groups]\n")
    assert str(e).startswith("c.toml: not TOML (")


# -- load_contracts: the file's bytes ----------------------------------------------------------

def test_load_records_the_sha256_of_the_file_bytes(tmp_path):
    p = tmp_path / "contracts.toml"
    data = VALID.encode("utf-8")
    p.write_bytes(data)
    f = load_contracts(str(p))
    assert f.sha256 == hashlib.sha256(data).hexdigest()
    assert f == dataclasses.replace(parse_contracts(VALID, str(p)), sha256=f.sha256)
    assert f.to_json()["sha256"] == f.sha256 and f.to_json()["path"] == str(p)
    # one byte more (a trailing newline) is another file
    p.write_bytes(data + b"\n")
    assert load_contracts(str(p)).sha256 == hashlib.sha256(data + b"\n").hexdigest()
    assert load_contracts(str(p)).sha256 != f.sha256


def test_load_refuses_a_file_that_is_not_utf8(tmp_path):
    p = tmp_path / "contracts.toml"
    p.write_bytes(b'version = 1\n# \xff\xfe\ndefault = "standard"\n')
    with pytest.raises(InputError) as exc:
        load_contracts(str(p))
    assert str(exc.value) == f"{p}: byte 15 is not UTF-8 (expected a TOML file)"
    assert exc.value.path == str(p)


def test_load_names_the_file_in_a_field_error(tmp_path):
    p = tmp_path / "contracts.toml"
    p.write_text(CLASSES + group("a", refill="0"), encoding="utf-8")
    with pytest.raises(InputError) as exc:
        load_contracts(str(p))
    assert str(exc.value) == (f"{p}: field 'groups[0].refill': expected a finite refill > 0 "
                              "blocks per second, found 0")


def test_load_refuses_a_missing_file(tmp_path):
    p = tmp_path / "nowhere.toml"
    with pytest.raises(InputError) as exc:
        load_contracts(str(p))
    assert exc.value.path == str(p)


# -- dumps_contracts round-trips ---------------------------------------------------------------

# U+007F is left out: see test_dumps_escapes_delete below.
names = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x7f"),
                min_size=1, max_size=12)
refills = st.floats(min_value=0, max_value=1e300, exclude_min=True, allow_nan=False,
                    allow_infinity=False, allow_subnormal=True)
bursts = st.floats(min_value=1, max_value=1e300, allow_nan=False, allow_infinity=False)
buckets = st.tuples(refills, bursts).map(list)


@settings(max_examples=150, deadline=None)
@given(groups=st.dictionaries(names, buckets, max_size=6),
       classes=st.dictionaries(names.filter(lambda n: not n.startswith("@")), buckets,
                               min_size=1, max_size=3),
       data=st.data())
def test_dumps_then_parse_round_trips(groups, classes, data):
    default = data.draw(st.sampled_from(sorted(classes)))
    text = dumps_contracts(default, classes, groups, comments=["a comment", ""],
                           notes={g: "a note" for g in list(groups)[:2]})
    f = parse_contracts(text, PATH)
    assert f.groups == groups
    assert f.classes == classes
    assert f.default == default
    # exactly: every float is the same float, not merely close
    for written, read in ((groups, f.groups), (classes, f.classes)):
        for k, v in written.items():
            assert [x.hex() for x in read[k]] == [x.hex() for x in v]
    assert f.table() == {**classes, **{"@" + g: v for g, v in groups.items()}}


def test_dumps_round_trips_awkward_names():
    groups = {'q"uote': [1.5, 2.0], "back\\slash": [1e-5, 1.0], "new\nline": [3.0, 1e16],
              "tab\tand\x00nul": [0.1, 1.1], "ünïcødé ☃ 𝄞": [2.0, 3.0], "@at": [4.0, 5.0],
              "'single'": [5e-324, 1.7976931348623157e308]}
    text = dumps_contracts("standard", DEFAULT_CONTRACTS, groups)
    f = parse_contracts(text, PATH)
    assert f.groups == groups and f.classes == DEFAULT_CONTRACTS
    assert f.contract_of("@at") == "@@at"


def test_dumps_escapes_delete():
    text = dumps_contracts("standard", DEFAULT_CONTRACTS, {"a\x7fb": [1.0, 1.0]})
    assert parse_contracts(text, PATH).groups == {"a\x7fb": [1.0, 1.0]}


# -- relabelled: a trace's requests under the file ---------------------------------------------

def request(i: int, group: str, contract: str) -> RequestEvent:
    return RequestEvent(line=i + 2, t_ns=i * 1000, id=f"r{i}", group=group, contract=contract,
                        scope="s", blocks=[i, i + 1], tail=3, out=4, prompt_tokens=35)


def test_relabelled_gives_listed_groups_their_own_and_others_the_default():
    f = parse_contracts(VALID, PATH)
    reqs = [request(0, "tenant-a", "critical"), request(1, "tenant-c", "gold"),
            request(2, "tenant b", "@tenant b"), request(3, "tenant-d", "bulk")]
    cancel = CancelEvent(line=9, t_ns=5000, id="r0")
    before = [dataclasses.replace(r) for r in reqs]
    events = [reqs[0], reqs[1], cancel, reqs[2], reqs[3]]
    out = list(f.relabelled(iter(events)))
    assert [type(e) for e in out] == [RequestEvent, RequestEvent, CancelEvent, RequestEvent,
                                      RequestEvent]
    assert [e.contract for e in out if type(e) is RequestEvent] == \
        ["@tenant-a", "bulk", "@tenant b", "bulk"]
    assert out[2] is cancel and cancel == CancelEvent(line=9, t_ns=5000, id="r0")
    # a request changed is a copy with only its contract changed; one already right is itself
    assert out[0] is not reqs[0] and out[1] is not reqs[1]
    assert out[3] is reqs[2] and out[4] is reqs[3]
    assert out[0] == dataclasses.replace(reqs[0], contract="@tenant-a")
    assert out[1] == dataclasses.replace(reqs[1], contract="bulk")
    # the originals are not mutated
    assert reqs == before
    assert [r.contract for r in reqs] == ["critical", "gold", "@tenant b", "bulk"]


def test_relabelled_is_lazy():
    f = parse_contracts(VALID, PATH)

    def events():
        yield request(0, "tenant-a", "x")
        raise AssertionError("read past the first event")

    it = f.relabelled(events())
    assert next(it).contract == "@tenant-a"


# -- contracts_params: a policy's parameters under the file ------------------------------------

def test_contracts_params():
    f = parse_contracts(VALID, PATH)
    ps = policy_class("prefixshield").defaults
    lru = policy_class("lru").defaults
    assert "contracts" in ps and "contracts" not in lru
    params = {"eps": 0.5}
    # no file: unchanged (the very dict)
    assert contracts_params(params, ps, None, "--candidate") is params
    # a contract-blind policy: unchanged
    assert contracts_params(params, lru, f, "--candidate") is params
    assert contracts_params({"x": 1}, {"x": 0}, f, "--candidate") == {"x": 1}
    # a policy with a contracts parameter: gains the file's table
    got = contracts_params(params, ps, f, "--candidate")
    assert got == {"eps": 0.5, "contracts": f.table()}
    assert params == {"eps": 0.5}
    # the same table given as a parameter as well: accepted
    same = {"eps": 0.5, "contracts": f.table()}
    assert contracts_params(same, ps, f, "--candidate") == same


def test_contracts_params_refuses_a_different_table():
    f = parse_contracts(VALID, PATH)
    ps = policy_class("prefixshield").defaults
    with pytest.raises(InputError) as exc:
        contracts_params({"contracts": DEFAULT_CONTRACTS}, ps, f, "--candidate-param")
    assert exc.value.path == "--candidate-param"
    assert str(exc.value) == ("--candidate-param: a 'contracts' parameter and --contracts "
                              "c.toml disagree: one run has one table (drop the parameter)")
    # one float off is another table
    table = f.table()
    table["@tenant-a"] = [12.5, math.nextafter(300.0, 0)]
    with pytest.raises(InputError):
        contracts_params({"contracts": table}, ps, f, "--baseline-param")


def test_more_contracts_than_a_block_can_index_are_refused():
    from psgate.contracts import MAX_CONTRACTS
    text = CLASSES + "".join(group(f"g{i}") for i in range(MAX_CONTRACTS))
    e = refused(text)
    assert e.field == "groups" and f"at most {MAX_CONTRACTS}" in str(e)
    ok = CLASSES + "".join(group(f"g{i}") for i in range(MAX_CONTRACTS - 2))
    assert len(parse_contracts(ok, PATH).table()) == MAX_CONTRACTS
