"""Entry ids (celery_pq.storage.ids): their stored form, the ids remembered lately, and the made
ids unique across threads and forks (no Redis)."""


def test_entry_ids_round_trip_and_uuids_take_17_bytes():
    import uuid

    from celery_pq.storage.ids import decode_id, encode_id

    tid = str(uuid.uuid4())
    assert len(encode_id(tid)) == 17 and len(encode_id(tid + "~12")) == 20
    samples = [tid, tid + "~12", tid.upper(), "plain", "12", "\x01odd", "\x02", "é~3", "a" * 16, "x~1"]
    for x in samples:
        assert decode_id(encode_id(x)) == x
    assert len({encode_id(x) for x in samples}) == len(samples)  # no two ids share a stored form


def test_an_id_decoded_lately_encodes_to_its_stored_form_from_memory(monkeypatch):
    from celery_pq.storage import ids

    monkeypatch.setattr(ids, "RECENT_MAX", 3)
    ids._RECENT.clear()
    raws = [b"\x01" + bytes([i]) * 16 for i in range(5)]
    texts = [ids.decode_id(r) for r in raws]
    assert texts[0] == "00000000-0000-0000-0000-000000000000"
    assert len(ids._RECENT) <= 3  # started again when full
    for raw, text in zip(raws, texts):
        assert ids.encode_id(text) == raw  # remembered or parsed again: the same stored form
    dup = b"\x01" + b"\xab" * 16 + b"~7"
    assert ids.encode_id(ids.decode_id(dup)) == dup and ids.decode_id(dup) not in ids._RECENT


def test_made_ids_are_unique_across_threads_forks_and_the_counter_going_round(monkeypatch):
    import os
    import threading

    from celery_pq.storage import ids

    made = []
    threads = [threading.Thread(target=lambda: made.extend(ids.unique_bytes() for _ in range(2000))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(made)) == len(made) == 8000 and {len(x) for x in made} == {12}

    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child's ids have a prefix of their own
        os.write(w, ids.unique_bytes())
        os._exit(0)
    os.waitpid(pid, 0)
    child = os.read(r, 12)
    os.close(r)
    os.close(w)
    assert child[:8] != ids.unique_bytes()[:8]

    before = ids.unique_bytes()[:8]
    monkeypatch.setattr(ids, "_COUNTER_SPAN", 0)  # the counter has gone round: a new prefix
    assert ids.unique_bytes()[:8] != before
