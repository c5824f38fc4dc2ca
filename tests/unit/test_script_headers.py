"""The Lua headers and the Python error enum agree; every script has the fixed header."""

import re

import pytest

from celery_pq.errors import ErrorCode
from celery_pq.keys import queue_keys, script_keys
from celery_pq.scripts import SCRIPT_NAMES, header, header_errors, signature, source
from celery_pq.scripts.source import _bindings


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_header_lists_keys_args_and_returns(name):
    text = header(name)
    assert text.startswith(f"-- {name}:"), text[:80]
    assert re.search(r"^-- KEYS\[1\] ", text, re.M)
    assert re.search(r"^-- Returns:", text, re.M)
    body = source(name)
    # every KEYS[i] the body uses is documented in the header
    used = {int(i) for i in re.findall(r"KEYS\[(\d+)\]", body)}
    documented = set()
    open_from = None
    for lo, hi, dots in re.findall(r"^-- KEYS\[(\d+)(?:\.\.(\d*))?\]", text, re.M) and [
        (m.group(1), m.group(2), m.group(0).endswith("..]")) for m in re.finditer(r"^-- KEYS\[(\d+)(?:\.\.(\d*))?\]", text, re.M)
    ]:
        if hi:
            documented |= set(range(int(lo), int(hi) + 1))
        elif dots:
            open_from = int(lo)
        else:
            documented.add(int(lo))
    undocumented = {i for i in used - documented if open_from is None or i < open_from}
    assert not undocumented, undocumented


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_error_codes_in_headers_match_the_enum(name):
    for code, label in re.findall(r"^-- ERR (-\d+) (\w+)$", header(name), re.M):
        assert ErrorCode[label] == int(code)


def test_every_error_code_is_used_by_some_script():
    declared = set()
    for name in SCRIPT_NAMES:
        declared |= {label for _, label in re.findall(r"^-- ERR (-\d+) (\w+)$", header(name), re.M)}
    assert declared == {c.name for c in ErrorCode}


def test_no_keyspace_scans_and_no_key_names_from_arguments():
    """Every key a script touches is one of its KEYS or named from the stem of KEYS[1] (same hash
    tag, same slot): no KEYS or SCAN over the keyspace, and no key name made from ARGV."""
    for name in SCRIPT_NAMES:
        body = source(name)
        assert not re.search(r"redis\.call\('(KEYS|SCAN)'", body), name
        assert not re.search(r"redis\.call\('\w+', [^)]*ARGV\[[^)]*\.\.", body), name


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_keys_are_named_in_the_header_and_bound_from_it(name):
    """The header names each key once; the caller builds the list from those names and the
    script binds them from the same names (no hand-written KEYS offsets in a script)."""
    sig = signature(name)
    assert len(set(sig.keys)) == len(sig.keys)
    k, d = queue_keys("orders"), queue_keys("orders.dead")
    assert all(key.startswith("pq:{orders}:") for key in script_keys(sig.keys, k, d))
    body = source(name)
    code = re.sub(r"--.*", "", body.replace(_bindings(sig), "", 1))
    # besides the bindings, only the stem of KEYS[1] names the queue's other keys
    assert set(re.findall(r"KEYS\[[^]]*\]", code)) <= {"KEYS[1]", "KEYS[#KEYS - nviews + v]"}
    assert not re.search(r"^--!", body, re.M)  # every directive was expanded


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_the_header_lists_the_error_codes_the_script_returns(name):
    body = re.sub(r"--.*|'[^']*'", "", source(name))
    used = {c.name for c in ErrorCode if re.search(rf"\b{c.name}\b", body)}
    if "mode_error(" in body:
        used.add("MODE_MISMATCH")
    assert set(header_errors(name)) == used
    first = source(name).splitlines()[0]
    for label in used - {"MODE_MISMATCH"}:  # pasted in from the enum
        assert re.match(r"local [\w, ]+ = [-\d, ]+$", first) and label in first
