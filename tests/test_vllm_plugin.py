"""The plugin's configuration read without vLLM: the policy config's contracts file, and
how a served request's group finds its contract (by name, or by the pseudonym a capture
gave it, so a file suggested from a capture applies to the server it came from)."""

from __future__ import annotations

import json

import pytest

from psgate.errors import InputError
from psgate.trace.redact import pseudonym
from psgate.vllm_plugin import contract_namer, load_contracts_file, load_params

KEY = bytes(range(32))


def _config(tmp_path, contracts_body: str | None, **doc):
    if contracts_body is not None:
        (tmp_path / "c.toml").write_text(contracts_body)
        doc["contracts"] = "c.toml"
    path = tmp_path / "policy.json"
    path.write_text(json.dumps(doc))
    return str(path)


def test_no_contracts_key_means_the_labels_decide(tmp_path):
    path = _config(tmp_path, None, params={"eps": 0.0})
    assert load_contracts_file(path) is None and load_params(path) == {"eps": 0.0}
    assert contract_namer(None, KEY) is None


def test_the_file_is_read_beside_the_config_and_names_served_groups(tmp_path):
    body = ('version = 1\ndefault = "standard"\n[[groups]]\nname = "acme"\n'
            'refill = 5.0\nburst = 50.0\n')
    file = load_contracts_file(_config(tmp_path, body))
    assert file.groups == {"acme": [5.0, 50.0]}
    name = contract_namer(file, None)
    assert name("acme", "critical") == "@acme"
    assert name("other", "critical") == "standard"


def test_a_file_suggested_from_a_capture_matches_by_pseudonym(tmp_path):
    captured = pseudonym("g", "acme", KEY)
    body = (f'version = 1\ndefault = "best-effort"\n[[groups]]\nname = "{captured}"\n'
            'refill = 5.0\nburst = 50.0\n')
    file = load_contracts_file(_config(tmp_path, body))
    assert contract_namer(file, KEY)("acme", "standard") == f"@{captured}"
    assert contract_namer(file, KEY)("zeta", "standard") == "best-effort"
    assert contract_namer(file, None)("acme", "standard") == "best-effort"   # no key


def test_a_bad_contracts_file_in_the_config_is_bad_input(tmp_path):
    path = _config(tmp_path, 'version = 1\ndefault = "gold"\n')
    with pytest.raises(InputError, match="field 'default'"):
        load_contracts_file(path)


def test_a_long_key_is_cut_as_the_capture_cuts_it(tmp_path):
    key = bytes(range(100))
    captured = pseudonym("g", "acme", key[:64])      # psgate.capture keys with 64 bytes
    body = (f'version = 1\ndefault = "best-effort"\n[[groups]]\nname = "{captured}"\n'
            'refill = 5.0\nburst = 50.0\n')
    file = load_contracts_file(_config(tmp_path, body))
    assert contract_namer(file, key)("acme", "standard") == f"@{captured}"
