"""The stored form of a message (celery_pq/storage/codec/): decode(encode(m)) == m for arbitrary kombu
message dicts, Celery protocol-2 messages with every field (defaults and not) and non-Celery
messages; bad records named."""

from __future__ import annotations

import base64
import json
import uuid
from datetime import UTC, datetime

import pytest
from celery import Celery
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kombu.utils.json import dumps as kombu_dumps

from celery_pq.storage import codec
from celery_pq.storage.codec import CELERY_EMBED_TAIL, CodecError, decode, encode

EXAMPLES = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

uuids = st.uuids().map(str)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.floats(allow_nan=False),
    st.text(max_size=30),
    uuids,
    st.sampled_from(["", "py", "{}", "()"]),
)
json_values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=10), inner, max_size=4)),
    max_leaves=12,
)
values = st.one_of(json_values, st.binary(max_size=30))  # a message dict may hold bytes (never JSON-stored)
names = st.one_of(st.text(max_size=12), st.sampled_from([n for _, n, _ in codec.layout.FIELDS]))


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


bodies = st.one_of(
    st.binary(max_size=200).map(_b64),  # kombu's virtual Channel: base64 text
    st.binary(max_size=200).map(lambda b: _b64(b + CELERY_EMBED_TAIL)),
    st.text(max_size=50),  # not base64, or base64 that is not canonical
    st.binary(max_size=50),
    json_values,
    st.binary(min_size=600, max_size=3000).map(lambda b: _b64(b * 3)),  # compressed
)


@st.composite
def kombu_messages(draw):
    """Any dict a kombu transport may be handed: known and unknown fields with any values,
    sections missing or not dicts."""
    props = draw(st.dictionaries(names, values, max_size=8))
    if draw(st.booleans()):
        props["delivery_info"] = draw(st.dictionaries(names, values, max_size=4))
    if draw(st.booleans()):
        props["body_encoding"] = "base64"
    message = {
        "body": draw(bodies),
        "content-type": draw(st.sampled_from(["application/json", "application/x-msgpack", "text/plain", None])),
        "content-encoding": draw(st.sampled_from(["utf-8", "binary", None])),
        "headers": draw(st.one_of(st.dictionaries(names, values, max_size=8), st.none())),
        "properties": props,
    }
    message.update(draw(st.dictionaries(names, values, max_size=2)))
    for key in draw(st.lists(st.sampled_from(list(message)), max_size=2)):
        message.pop(key, None)
    return message


@given(kombu_messages())
@EXAMPLES
def test_any_kombu_message_round_trips(message):
    assert decode(encode(message)) == message


def _maybe(draw, default, other):
    return default if draw(st.booleans()) else draw(other)


@st.composite
def celery_messages(draw):
    """A Celery protocol-2 message (celery/app/amqp.py as_task_v2), each field at its default
    or another value, the body [args, kwargs, embed] as JSON in base64."""
    task_id = draw(uuids)
    args = draw(st.lists(json_values, max_size=4))
    kwargs = draw(st.dictionaries(st.text(max_size=8), json_values, max_size=3))
    embed = _maybe(
        draw,
        {"callbacks": None, "errbacks": None, "chain": None, "chord": None},
        st.dictionaries(st.text(max_size=8), json_values, max_size=4),
    )
    body = json.dumps([args, kwargs, embed]).encode()
    any_id = st.one_of(st.none(), uuids, st.just(task_id), st.text(max_size=20))
    headers = {
        "lang": _maybe(draw, "py", scalars),
        "task": draw(st.text(max_size=40)),
        "id": task_id,
        "shadow": _maybe(draw, None, scalars),
        "eta": _maybe(draw, None, st.datetimes().map(str)),
        "expires": _maybe(draw, None, st.datetimes().map(str)),
        "group": draw(any_id),
        "group_index": _maybe(draw, None, st.integers()),
        "retries": _maybe(draw, 0, st.integers()),
        "timelimit": _maybe(draw, [None, None], st.lists(st.one_of(st.none(), st.floats(allow_nan=False)), max_size=3)),
        "root_id": draw(any_id),
        "parent_id": draw(any_id),
        "argsrepr": _maybe(draw, repr(tuple(args)), st.text(max_size=30)),
        "kwargsrepr": _maybe(draw, repr(kwargs), st.text(max_size=30)),
        "origin": draw(st.text(max_size=20)),
        "ignore_result": _maybe(draw, False, scalars),
        "replaced_task_nesting": _maybe(draw, 0, scalars),
        "stamped_headers": _maybe(draw, None, json_values),
        "stamps": _maybe(draw, {}, json_values),
    }
    headers.update(draw(st.dictionaries(st.text(max_size=10), values, max_size=2)))  # apply_async(headers=...)
    props = {
        "correlation_id": _maybe(draw, task_id, any_id),
        "reply_to": draw(st.one_of(uuids, st.text())),
        "delivery_mode": _maybe(draw, 2, scalars),
        "delivery_info": {
            "exchange": _maybe(draw, "", st.text(max_size=10)),
            "routing_key": draw(st.text(max_size=10)),
        },
        "priority": draw(st.integers(0, 255)),
        "body_encoding": "base64",
    }
    if draw(st.booleans()):
        props["expiration"] = str(draw(st.integers(0, 10**9)))
    if draw(st.booleans()):
        props["delivery_tag"] = draw(uuids)
    for key in draw(st.lists(st.sampled_from(list(headers)), max_size=2)):
        if key not in ("lang", "task"):
            headers.pop(key, None)
    return {
        "body": _b64(body),
        "content-encoding": "utf-8",
        "content-type": "application/json",
        "headers": headers,
        "properties": props,
    }


@given(celery_messages())
@EXAMPLES
def test_celery_messages_of_every_protocol_field_round_trip(message):
    assert decode(encode(message)) == message


def _celery_message(args=("order-00000001", 0.0), kwargs=None, **options) -> dict:
    """The message Celery's as_task_v2 makes, as kombu's virtual Channel hands it to a transport."""
    app = Celery("proj", set_as_current=False)
    task_id = str(uuid.uuid4())
    m = app.amqp.as_task_v2(task_id, "proj.tasks.process_order", args=args, kwargs=kwargs or {}, **options)
    body = json.dumps(list(m.body)).encode()
    return {
        "body": _b64(body),
        "content-encoding": "utf-8",
        "content-type": "application/json",
        "headers": json.loads(json.dumps(m.headers)),
        "properties": {
            **m.properties,
            "reply_to": str(uuid.uuid4()),
            "delivery_mode": 2,
            "priority": 7,
            "delivery_info": {"exchange": "", "routing_key": "celery"},
            "body_encoding": "base64",
        },
    }


def test_a_plain_celery_task_is_stored_in_a_seventh_of_its_json():
    # Given a task as Celery publishes it
    message = _celery_message()
    # When it is encoded, then it reads back the same and is far smaller than kombu's JSON of it
    data = encode(message)
    assert decode(data) == message
    assert len(data) * 7 < len(kombu_dumps(message))
    # the task id is written once (id, root_id, correlation_id), as 16 bytes, never as text
    task_id = message["headers"]["id"]
    assert data.count(uuid.UUID(task_id).bytes) == 1 and task_id.encode() not in data
    # argsrepr is derived from the body, not stored
    assert b"order-00000001" in data and data.count(b"order-00000001") == 1
    assert data[1] & codec.layout.F_ARGSREPR and data[1] & codec.layout.F_KWARGSREPR


def test_a_chained_task_keeps_parent_root_and_group():
    parent, root, group = (str(uuid.uuid4()) for _ in range(3))
    message = _celery_message(
        parent_id=parent,
        root_id=root,
        group_id=group,
        group_index=2,
        retries=3,
        eta=datetime(2030, 1, 1, tzinfo=UTC),
        expires=60.5,
        time_limit=30,
        soft_time_limit=20,
    )
    decoded = decode(encode(message))
    assert decoded == message
    assert (decoded["headers"]["parent_id"], decoded["headers"]["root_id"], decoded["headers"]["group"]) == (
        parent,
        root,
        group,
    )


def test_an_argsrepr_celery_shortened_is_kept_as_it_is():
    message = _celery_message(args=("x" * 2000,))
    assert message["headers"]["argsrepr"] != repr(("x" * 2000,))  # saferepr cut it
    data = encode(message)
    assert decode(data) == message and not data[1] & codec.layout.F_ARGSREPR


def test_large_records_are_compressed_only_when_it_pays():
    text = {"note": "the quick brown fox jumps over the lazy dog " * 100}
    noise = {"noise": uuid.uuid4().hex * 60}
    big, incompressible = _celery_message(kwargs=text), _celery_message(kwargs=noise)
    assert encode(big)[1] & codec.layout.F_ZSTD and len(encode(big)) < 500
    assert decode(encode(big)) == big and decode(encode(incompressible)) == incompressible
    assert not encode(_celery_message())[1] & codec.layout.F_ZSTD  # small: never offered


@pytest.mark.parametrize("body", ["QQ==", "QR==", "QUI=", "QUJ=", "QUJD", "QQ", "Q===", "QQ==\n", " QQ==", "QQ=a", ""])
def test_a_body_is_stored_as_bytes_only_when_it_is_their_one_base64_spelling(body):
    # "QR==" and "QUJ=" decode to the bytes of "QQ==" and "QUI=" (low bits dropped): kept as text
    message = {"body": body, "headers": {}, "properties": {"body_encoding": "base64"}}
    data = encode(message)
    assert decode(data) == message
    canonical = body in ("QQ==", "QUI=", "QUJD", "")
    assert (data[2 + data[2:].index(codec.layout.C_BODY) + 1] == codec.layout.B_BASE64) == canonical


@pytest.mark.parametrize(
    "text",
    [
        "CF03FC8B-FDE8-4BE2-80AE-5E729995E5AE",
        "cf03fc8b-fde8-4be2-80ae-5e729995e5a ",
        "cf03fc8b fde8-4be2-80ae-5e729995e5ae",
        "cf03fc8bxfde8x4be2x80aex5e729995e5ae",
    ],
)
def test_a_text_shaped_almost_like_a_uuid_is_kept_as_text(text):
    message = _celery_message()
    message["headers"]["parent_id"] = text
    data = encode(message)
    assert decode(data) == message and text.encode() in data


def test_repeating_fields_read_the_same_from_the_cache_whatever_they_hold():
    # Given Celery messages whose task name, origin and routing key repeat, or are UUIDs, or are
    # a str subclass, or long, written after one another (the records of repeating texts are cached)
    class Name(str):
        pass

    reply_queue = str(uuid.uuid4())
    for task, origin, routing_key in [
        ("proj.a", "gen1@host", "celery"),
        ("proj.a", "gen1@host", "celery"),
        (Name("proj.a"), "gen1@host", reply_queue),
        ("proj.b", reply_queue, "celery"),
        ("é" * 3, "x" * 300, Name("celery")),
        ("proj.a", "gen1@host", "celery"),
    ]:
        message = _celery_message()
        message["headers"].update(task=task, origin=origin)
        message["properties"]["delivery_info"]["routing_key"] = routing_key
        message["properties"]["reply_to"] = reply_queue
        decoded = decode(encode(message))
        # then each reads back as written, its types too
        assert decoded == message
        assert (
            type(decoded["headers"]["task"]) is str
            and decoded["properties"]["delivery_info"]["routing_key"] == routing_key
        )


def test_the_caches_start_again_when_full(monkeypatch):
    monkeypatch.setattr(codec.bounds, "CACHE_MAX", 2)
    monkeypatch.setattr(
        codec.writer, "_RECORDS", {code: {} for code in codec.writer._RECORDS}
    )  # none from earlier tests
    monkeypatch.setattr(codec.writer, "_PACKED", {})
    monkeypatch.setattr(codec.reprs, "_REPRS", {})
    for n in range(5):
        message = _celery_message(args=(f"order-{n}", n))
        message["headers"]["task"] = f"proj.task{n}"
        assert decode(encode(message)) == message
        assert decode(encode(message)) == message  # read again: the argsrepr from the cache
    assert all(len(cache) <= 2 for cache in codec.writer._RECORDS.values()) and len(codec.writer._PACKED) <= 2
    assert 0 < len(codec.reprs._REPRS) <= 2


def test_values_of_other_types_go_through_kombus_json_as_before():
    when = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
    message = {"body": "x", "headers": {"when": when, "pair": (1, 2)}, "properties": {}}
    assert decode(encode(message)) == {**message, "headers": {"when": when, "pair": [1, 2]}}


def _plain_task() -> dict:
    """A plain task as Celery 5 publishes it, every value fixed."""
    body = json.dumps(
        [["order-00000001", 0.5], {}, {"callbacks": None, "errbacks": None, "chain": None, "chord": None}]
    ).encode()
    tid = "cf03fc8b-fde8-4be2-80ae-5e729995e5ae"
    return {
        "body": _b64(body),
        "content-encoding": "utf-8",
        "content-type": "application/json",
        "headers": {
            "lang": "py",
            "task": "proj.add",
            "id": tid,
            "shadow": None,
            "eta": None,
            "expires": None,
            "group": None,
            "group_index": None,
            "retries": 0,
            "timelimit": [None, None],
            "root_id": tid,
            "parent_id": None,
            "argsrepr": "('order-00000001', 0.5)",
            "kwargsrepr": "{}",
            "origin": "gen1@host",
            "ignore_result": False,
            "replaced_task_nesting": 0,
            "stamped_headers": None,
            "stamps": {},
        },
        "properties": {
            "correlation_id": tid,
            "reply_to": "9b1deb4d-3b7d-4bad-9bdd-2b0d7b3dcb6d",
            "delivery_mode": 2,
            "delivery_info": {"exchange": "", "routing_key": "celery"},
            "priority": 3,
            "body_encoding": "base64",
        },
    }


#: _plain_task() as the first writer of format version 1 stored it (kept by hand, byte for byte)
PLAIN_TASK_V1 = (
    b'\x01\x07\x08\x04\x1c[["order-00000001", 0.5], {}\x18\x05\x08proj.add\x19\x07\xcf\x03\xfc\x8b'
    b"\xfd\xe8K\xe2\x80\xae^r\x99\x95\xe5\xae!\x08\x00%\x05\tgen1@host\r\x08\x00\x0e\x07\x9b\x1d\xebM;}K"
    b"\xad\x9b\xdd+\r{=\xcbm\x16\x05\x06celery\x11\x03\x06"
)


def test_a_record_of_this_format_written_before_reads_and_is_written_the_same():
    # Given a record the first version-1 writer made; then it reads back, and is what is written today
    assert decode(PLAIN_TASK_V1) == _plain_task()
    assert encode(_plain_task()) == PLAIN_TASK_V1


def test_argsrepr_of_a_large_body_is_derived_from_its_args_alone():
    # Given a task whose kwargs make its body far longer than REPR_BODY_MAX
    message = _celery_message(args=("order-1", 2.5), kwargs={"lines": [f"sku-{i}" for i in range(400)]})
    assert len(base64.b64decode(message["body"])) > codec.reprs.REPR_BODY_MAX
    data = encode(message)
    # then argsrepr is not stored (read from the args), kwargsrepr (cut by Celery) is kept as it is
    assert (
        data[1] & codec.layout.F_ZSTD and data[1] & codec.layout.F_ARGSREPR and not data[1] & codec.layout.F_KWARGSREPR
    )
    assert decode(data) == message


@pytest.mark.parametrize(
    "data, problem",
    [
        (b"", "too short"),
        (b"\x01", "too short"),
        (b"\x09\x00", "format version 9"),
        (b'{"body": ""}', "format version 123"),  # kombu's JSON is not the stored form
        (b"\x01\x80", "unknown flags"),
        (b"\x01\x00\x08\x09", "unknown body form"),
        (b"\x01\x00\x0d\x63", "unknown value tag"),
        (b"\x01\x00\x0d\x05\x09ab", "truncated or corrupt"),
        (b"\x01\x08garbage", "zstd frame is corrupt"),
        (b"\x01\x00\x7f\x00", "truncated or corrupt"),
    ],
)
def test_a_record_that_is_not_one_is_named(data, problem):
    with pytest.raises(CodecError, match=problem):
        decode(data)


def test_a_message_that_cannot_be_written_is_named():
    with pytest.raises(CodecError, match="is a dict"):
        encode(["body"])
    with pytest.raises(CodecError, match="field name 3"):
        encode({"body": "", 3: "x"})


def test_mappings_of_a_dict_subclass_are_written_field_by_field():
    class Headers(dict):
        pass

    message = _celery_message()
    message["headers"] = Headers(message["headers"], extra=Headers(a=1))
    data = encode(message)
    assert decode(data) == message and len(data) < 200


@given(st.binary(max_size=300), kombu_messages())
@EXAMPLES
def test_a_body_published_as_its_bytes_is_stored_as_its_base64_text_is(raw, message):
    # Given a message whose body is the base64 text of some bytes, and the same message with the
    # body as those bytes (the transport's publish keeps a Base64Body instead of making the text)
    props = message["properties"] if isinstance(message.get("properties"), dict) else {}
    message = {**message, "body": _b64(raw), "properties": {**props, "body_encoding": "base64"}}
    as_bytes = {**message, "body": codec.Base64Body(raw)}
    # Then both are stored as the same bytes, and read back as the text
    assert encode(as_bytes) == encode(message)
    assert decode(encode(as_bytes)) == message


scalars = st.one_of(st.none(), st.booleans(), st.integers(-300, 300), st.text(max_size=40), st.binary(max_size=8))


@given(
    st.one_of(bodies, st.binary(max_size=300).map(codec.Base64Body)),
    st.tuples(
        *([st.one_of(st.sampled_from(["utf-8", "application/json", "text/plain", "", 2, 0, "base64"]), scalars)] * 6)
    ),
    st.one_of(st.sampled_from(["rk", "é", "x" * 200, str(uuid.uuid4())]), scalars),
)
@EXAMPLES
def test_a_plain_kombu_message_is_written_as_the_section_writer_writes_it(body, fields, routing_key):
    # Given a plain kombu message (no headers) in the order kombu's virtual channel makes it,
    # each field holding its default, another value of its type, or a value of another type
    encoding, ctype, mode, exchange, priority, body_encoding = fields
    message = {
        "body": body,
        "content-encoding": encoding,
        "content-type": ctype,
        "headers": {},
        "properties": {
            "delivery_mode": mode,
            "delivery_info": {"exchange": exchange, "routing_key": routing_key},
            "priority": priority,
            "body_encoding": body_encoding,
        },
    }
    raw = codec.writer._base64_body(message)
    fast, loop = bytearray(), bytearray()
    # Then the fast path writes the same records, byte for byte, as the loop over its sections
    assert codec.writer._write_plain(fast, message, raw)
    codec.writer._write_section(loop, {}, codec.layout.S_MESSAGE, message, False, 0, raw)
    assert bytes(fast) == bytes(loop)
    # and any other shape is left to the loop
    for other in ({**message, "headers": {"a": 1}}, dict(reversed(message.items()))):
        assert not codec.writer._write_plain(bytearray(), other, raw)


def test_a_delivery_reads_a_base64_body_as_its_bytes():
    message = {
        "body": _b64(b"[[1], {}, {}]"),
        "content-type": "application/json",
        "content-encoding": "utf-8",
        "headers": {},
        "properties": {"body_encoding": "base64", "delivery_info": {}},
    }
    got = decode(encode(message), raw_body=True)
    assert type(got["body"]) is codec.Base64Body and got["body"] == b"[[1], {}, {}]"
    assert {**got, "body": message["body"]} == message
    # a body not stored as base64 is given as it is
    text = {**message, "body": "not base64!", "properties": {"body_encoding": None, "delivery_info": {}}}
    assert decode(encode(text), raw_body=True) == text


def test_a_bytes_body_marked_base64_with_another_encoding_is_kept_as_bytes():
    message = {"body": codec.Base64Body(b"abc"), "properties": {"body_encoding": "utf-8"}}
    assert decode(encode(message)) == {**message, "body": b"abc"}


# -- untrusted stored bytes: what a reader allocates is bounded ---------------------------------
try:
    from support.bombs import BOMB_BYTES, fields_bomb, lying_bomb, varint_bomb, zstd_bomb
except ImportError:  # collected with the repository root on sys.path instead of tests/
    from tests.support.bombs import BOMB_BYTES, fields_bomb, lying_bomb, varint_bomb, zstd_bomb


def _blob(data: bytes) -> bytes:
    out = bytearray()
    codec.writer._blob(out, data)
    return bytes(out)


def _peak_while(fn) -> tuple[int, Exception | None]:
    """(the most bytes Python allocated at once while ``fn`` ran, what it raised)."""
    import tracemalloc

    tracemalloc.start()
    try:
        fn()
        raised = None
    except Exception as exc:
        raised = exc
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return peak, raised


def test_a_zstd_frame_declaring_300_mb_from_9_kb_is_refused_before_anything_is_inflated():
    # Given a stored record of 9.6 KB whose zstd frame declares (and holds) 300 MB
    bomb = zstd_bomb()
    assert len(bomb) < 10_000
    # When it is read, Then it is refused with the size it declares, and the reader allocated
    # under 1 MB on the way (inflating it would take 300 MB)
    peak, raised = _peak_while(lambda: decode(bomb, raw_body=True))
    assert isinstance(raised, CodecError) and f"declares {BOMB_BYTES} bytes" in str(raised)
    assert peak < 1 << 20, peak


def test_a_zstd_frame_that_holds_more_than_it_declares_fails_at_the_declared_size():
    bomb = lying_bomb(declared=1000)
    peak, raised = _peak_while(lambda: decode(bomb))
    assert isinstance(raised, CodecError) and "corrupt" in str(raised)
    assert peak < 1 << 20, peak


def test_a_zstd_frame_that_does_not_declare_its_size_is_refused():
    import zstandard

    frame = zstandard.ZstdCompressor(write_content_size=False).compress(b"\0" * 1000)
    with pytest.raises(CodecError, match="does not declare its size"):
        decode(bytes((codec.VERSION, codec.layout.F_ZSTD)) + frame)


def test_a_record_of_too_many_fields_is_refused_with_bounded_memory():
    # 70,000 fields in 280 KB: as a dict of fields it would be several MB of Python objects
    assert decode(fields_bomb(3))["a"] is None  # a well-formed record: the field is read
    bomb = fields_bomb(codec.bounds.MAX_VALUES + 1)
    peak, raised = _peak_while(lambda: decode(bomb))
    assert isinstance(raised, CodecError) and f"more than {codec.bounds.MAX_VALUES} fields" in str(raised)
    assert peak < 16 << 20, peak


@pytest.mark.parametrize(
    "value",
    [
        bytes((codec.layout.T_LIST,)) + b"\xff\xff\xff\xff\x0f",  # a list declaring 4 billion items in 7 bytes
        bytes((codec.layout.T_DICT,)) + b"\xff\xff\x7f",
        bytes((codec.layout.T_LIST, 2, codec.layout.T_LIST)) + b"\x80\x80\x04" + bytes((codec.layout.T_NONE,)) * 10,
        bytes((codec.layout.T_JSON,)) + _blob(b"[" + b"0," * 65_536 + b"0]"),  # kombu's JSON of a tuple
    ],
)
def test_a_record_of_too_many_list_and_dict_items_is_refused_before_they_are_made(value):
    record = bytes((codec.VERSION, 0, codec.layout.S_HEADERS, 1)) + b"x" + value
    with pytest.raises(CodecError, match=f"more than {codec.bounds.MAX_VALUES} list and dict items"):
        decode(record)


def test_lists_nested_too_deep_are_refused():
    record = bytes((codec.VERSION, 0, codec.layout.S_HEADERS, 1)) + b"x" + bytes((codec.layout.T_LIST, 1)) * 5000
    with pytest.raises(CodecError, match="nested too deep"):
        decode(record + bytes((codec.layout.T_NONE,)))


def test_the_writer_keeps_to_the_readers_bounds(monkeypatch):
    # A message of more list items than a reader takes is refused at write: nothing is stored
    with pytest.raises(CodecError, match=f"cannot be stored.*more than {codec.bounds.MAX_VALUES} list and dict items"):
        encode({"body": "", "headers": {"ids": list(range(codec.bounds.MAX_VALUES + 1))}, "properties": {}})
    ok = {"body": "", "headers": {"ids": list(range(1000))}, "properties": {}}
    assert decode(encode(ok)) == ok
    # and a record larger than a reader inflates is stored uncompressed, and reads back
    monkeypatch.setattr(codec.bounds, "MAX_INFLATED", 4096)
    big = {"body": "0" * 10_000, "headers": {}, "properties": {}}
    data = encode(big)
    assert not data[1] & codec.layout.F_ZSTD and decode(data) == big
    small = {"body": "0" * 3000, "headers": {}, "properties": {}}
    assert encode(small)[1] & codec.layout.F_ZSTD and decode(encode(small)) == small


# -- varints: each bounded by what a valid record can hold --------------------------------------
#: The bounds as documented (docs/storage.md): a length, count or reference takes at most 5 bytes
#: (codec.bounds.MAX_VARINT_BYTES), an integer at most 2048 (codec.bounds.MAX_INT_BYTES).
VARINT_MOST, INT_MOST = 5, 2048


def _header(value: bytes) -> bytes:
    """A record of one header ``x`` holding ``value`` (a tag and its data)."""
    return bytes((codec.VERSION, 0, codec.layout.S_HEADERS, 1)) + b"x" + value


def _long(n: int) -> bytes:
    """A varint of ``n`` bytes: n - 1 of 0xFF, then 0x01."""
    return b"\xff" * (n - 1) + b"\x01"


#: Where a record holds a length, a count or a reference, as a function of that varint.
VARINT_PLACES = {
    "field name": lambda v: bytes((codec.VERSION, 0, codec.layout.S_MESSAGE)) + v,
    "string": lambda v: _header(bytes((codec.layout.T_STR,)) + v),
    "bytes": lambda v: _header(bytes((codec.layout.T_BYTES,)) + v),
    "json": lambda v: _header(bytes((codec.layout.T_JSON,)) + v),
    "list": lambda v: _header(bytes((codec.layout.T_LIST,)) + v),
    "dict": lambda v: _header(bytes((codec.layout.T_DICT,)) + v),
    "dict key": lambda v: _header(bytes((codec.layout.T_DICT, 1)) + v),
    "reference": lambda v: _header(bytes((codec.layout.T_REF,)) + v),
    "body": lambda v: bytes((codec.VERSION, 0, codec.layout.C_BODY, codec.layout.B_BYTES)) + v,
}


@pytest.mark.parametrize("place", sorted(VARINT_PLACES))
def test_a_length_count_or_reference_of_more_than_five_bytes_is_refused(place):
    record = VARINT_PLACES[place]
    # A varint of 5 bytes (35 bits, more than any record holds) is read, and what it says is
    # then checked (a length past the end, a count over MAX_VALUES, a reference to no UUID)
    with pytest.raises(CodecError) as five:
        decode(record(_long(VARINT_MOST)))
    assert "runs over" not in str(five.value)
    # one of 6 bytes, or of ten million, is refused where it starts, naming the bound
    for n in (VARINT_MOST + 1, 10_000_000):
        with pytest.raises(CodecError, match=f"varint at byte \\d+ runs over {VARINT_MOST} bytes"):
            decode(record(_long(n)))


def test_a_zstd_record_of_a_16_mb_varint_is_refused_at_its_sixth_byte():
    # Given a 542-byte record that inflates (within MAX_INFLATED) to a varint of 16 million 0xFF
    # bytes: shifted in byte by byte, a number of 100 million bits is rebuilt 16 million times
    bomb = varint_bomb()
    assert len(bomb) < 1000
    # Then the reader refuses it at the bound, having read six bytes of the varint
    with pytest.raises(CodecError, match="varint at byte 1 runs over 5 bytes"):
        decode(bomb, raw_body=True)


def _varint_by_shifts(z: int) -> bytes:
    """The varint of ``z`` seven bits at a time, as the first writer made every one."""
    out = bytearray()
    while z > 0x7F:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


@given(st.one_of(st.integers(), st.integers(-(2**14335) + 1, 2**14335 - 1)))
@EXAMPLES
def test_an_integer_of_any_size_a_reader_takes_is_stored_as_before_and_reads_back(n):
    out = bytearray()
    codec.writer._write_int(out, n)
    assert bytes(out) == _varint_by_shifts(n << 1 if n >= 0 else ((-n) << 1) - 1)
    message = {"body": "", "headers": {"n": n, "ns": [n, -n]}}
    assert decode(encode(message)) == message


def test_integers_are_bounded_by_what_kombus_json_carries():
    # The largest integer Python writes as text (4,300 digits, kombu's JSON's limit) is stored
    for n in (10**4300 - 1, -(10**4300) + 1, 2**14335 - 1, -(2**14335)):
        message = {"body": "", "headers": {"n": n}}
        assert decode(encode(message)) == message
    # an integer over MAX_INT_BYTES of varint is refused at write, naming its size
    with pytest.raises(CodecError, match="integer of 14337 bits cannot be stored"):
        encode({"body": "", "headers": {"n": 2**14335}})
    # and at read: a varint of MAX_INT_BYTES is an integer, one byte more is refused
    assert decode(_header(bytes((codec.layout.T_INT,)) + _long(INT_MOST)))["headers"]["x"] < 0
    for n in (INT_MOST + 1, 10_000_000):
        with pytest.raises(CodecError, match=f"integer at byte 6 runs over {INT_MOST} bytes"):
            decode(_header(bytes((codec.layout.T_INT,)) + _long(n)))
    # an integer cut short is a truncated record, long or not
    for n in (3, 20, INT_MOST - 1):
        with pytest.raises(CodecError, match="truncated"):
            decode(_header(bytes((codec.layout.T_INT,)) + b"\xff" * n))
