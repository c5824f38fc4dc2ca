"""The Lua headers and the Python error enum agree; every script has the fixed header."""

import re

import pytest

from celery_pq.scripts import SCRIPT_NAMES, header, header_errors, signature, source
from celery_pq.scripts.assembly import _bindings
from celery_pq.storage.errors import ErrorCode
from celery_pq.storage.keys import queue_keys, script_keys


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
        (m.group(1), m.group(2), m.group(0).endswith("..]"))
        for m in re.finditer(r"^-- KEYS\[(\d+)(?:\.\.(\d*))?\]", text, re.M)
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
    # the codes of an error reply (ERROR_REPLY): MODE_MISMATCH and MIGRATING
    replied = {ErrorCode(int(c)).name for c in re.findall(r"'PQ (-\d+) ", source(name))}
    assert set(header_errors(name)) == used | replied
    first = source(name).splitlines()[0]
    for label in used:  # pasted in from the enum
        assert re.match(r"local [\w, ]+ = [-\d, ]+$", first) and label in first


_ARGV_LINE = r"^-- ARGV\[([^\]]+)\] "


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_argv_is_named_in_the_header_one_line_each(name):
    """Every ARGV line parses (``signature`` raises on a line out of order or not of the form),
    each name once; the script's code reads no ARGV position its header does not declare."""
    sig = signature(name)
    names = [*sig.argv, *sig.rest, *(["context"] if sig.context else [])]
    assert len(set(names)) == len(names), names
    lines = re.findall(_ARGV_LINE, header(name), re.M)
    assert len(lines) == len(sig.argv) + bool(sig.rest) + sig.context
    assert sig.context == ("take_context()" in source(name))
    singles = {w for w in lines if ".." not in w and w != "0"}
    lists = {tuple(w.split("..")) for w in lines if ".." in w}
    counts = {count for count, _, _ in sig.counts}
    code = re.sub(r"--.*", "", source(name))
    for used in re.findall(r"\bARGV\[([^\]]+)\]", code):
        pos = re.sub(r"\s+", "", used)
        if pos.isdigit():  # a fixed position: declared, or inside the open group at the end
            assert pos in singles or any(int(pos) >= int(a) for a, b in lists if a.isdigit() and not b), (name, used)
        elif set(re.findall(r"[a-z_]+", pos)) <= counts:  # after a counted list: a declared position
            assert pos in singles, (name, used)
    for a, b in re.findall(r"unpack\(ARGV, ([^,]+), ([^)]+)\)", code):
        assert (re.sub(r"\s+", "", a), re.sub(r"\s+", "", b)) in lists, (name, a, b)


def test_signature_args_lays_out_argv_from_names():
    pop = signature("pop")
    given = {
        "lease_ms": 1,
        "consumer": "c",
        "token_base": "b",
        "count": 3,
        "stale_budget": 4,
        "lo": 0,
        "hi": 255,
        "take_hi": 9,
    }
    assert pop.bind()("e1", "t1", "e2", "t2", **given, context="x") == [
        1,
        "c",
        "b",
        3,
        4,
        0,
        255,
        9,
        2,
        "e1",
        "t1",
        "e2",
        "t2",
        "x",
    ]
    insert = signature("insert")
    head = {"max_length": 0, "max_per_tenant": 0, "views_version": "v", "made": "0", "context": "x"}
    assert insert.bind()(*"abcdefghi", **head, views=["0,3", "4,9"], forget=["p"], unique=["0,w,1,k"]) == [
        0,
        0,
        "v",
        2,
        "0,3",
        "4,9",
        1,
        "p",
        "0",
        1,
        "0,w,1,k",
        *"abcdefghi",
        "x",
    ]
    with pytest.raises(TypeError, match=r"missing \['views', 'forget', 'unique'\], unexpected \['nviews'\]"):
        insert.bind()(**head, nviews=0)
    with pytest.raises(TypeError, match="3 repeated values"):
        pop.bind()("e1", "t1", "e2", **given, context="x")
    with pytest.raises(TypeError, match=r"unexpected \['context'\]"):
        signature("extend").bind()(lease_ms=1, context="x")
    assert signature("extend").bind()("e", "t", lease_ms=5) == [5, "e", "t"]


def test_a_bound_layout_fixes_values_once_and_takes_the_rest_by_name():
    pop = signature("pop")
    fixed = {"lease_ms": 1, "consumer": "c", "count": 3, "stale_budget": 4, "lo": 0, "hi": 255, "take_hi": 9}
    layout = pop.bind(**fixed, context="x")
    assert layout.free == ("token_base",)
    assert layout("e1", "t1", token_base="b") == pop.bind()("e1", "t1", **fixed, token_base="b", context="x")
    assert layout(token_base="b2") == [1, "c", "b2", 3, 4, 0, 255, 9, 0, "x"]
    insert = signature("insert").bind(max_length=0, max_per_tenant=0, views_version="v", views=["0,3"], context="x")
    assert insert(*"abcdefghi", forget=["p", "q"], made="0", unique=[]) == [
        *[0, 0, "v", 1, "0,3", 2, "p", "q", "0", 0, *"abcdefghi", "x"]
    ]
    with pytest.raises(TypeError, match=r"missing \['token_base'\], unexpected \['token'\]"):
        layout(token="b")
    with pytest.raises(TypeError, match="1 repeated values"):
        layout("e1", token_base="b")
    with pytest.raises(TypeError, match=r"takes no \['nacks'\]"):
        pop.bind(nacks=1)


@pytest.mark.parametrize(
    "lines",
    [
        "-- ARGV[2] b  skips ARGV[1]",
        "-- ARGV[1] a  one\n-- ARGV[1] b  again",
        "-- ARGV[1] a b  two names, not a group",
        "-- ARGV[1] n  count\n-- ARGV[2..1+n] x y...  two per n, counted once",
        "-- ARGV[1..] x...  the rest\n-- ARGV[2] a  after the rest",
        "-- ARGV[0] ctx  not named context",
    ],
)
def test_a_header_out_of_the_forms_is_refused(monkeypatch, lines):
    from celery_pq.scripts import headers

    monkeypatch.setattr(headers, "header", lambda name: lines)
    with pytest.raises(ValueError):
        headers._argv("made_up")
