"""CPU of the stored form per message: celery-pq's codec against the JSON layout it replaced.

The JSON layout is kombu's: the message dict dumped as JSON with its body in base64
(``kombu.utils.json.dumps``), read with ``loads``. Both reads end with the body's base64 decode
kombu makes next (the codec hands kombu the same base64 text), so "read" is up to the body's
bytes either way:

- write: ``codec.encode(m)`` against ``dumps(m)``;
- read:  ``codec.decode(record)`` + ``b64decode(body)`` against ``loads(json)`` + ``b64decode(body)``.

Messages: small, medium and large Celery tasks (the tasks of benchmarks/memory_tasks.py: args
only, about 1 KB of kwargs, a 20 KB body) as kombu's virtual channel hands them to a transport,
and a non-Celery kombu message (``Producer.publish`` of a small dict). Figures: CPU µs per call
(process time, best of ``--rounds`` rounds of ``--calls`` calls, the two layouts interleaved),
and, when valgrind is on the machine, instructions per call counted by callgrind (the same on
any load: the ratio to trust on a shared machine). Ratios are codec / JSON: below 1 the codec is
cheaper.

    python -m benchmarks.codec_cpu [--calls 300] [--rounds 5] [--callgrind 1] [--smoke] [--out DIR]
"""

from __future__ import annotations

import base64
import functools
import json
import os
import pickle
import random
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

from kombu.utils.json import dumps, loads

from celery_pq.storage import codec

from .common import cli, table

MESSAGES = ("small", "medium", "large", "kombu")
#: the operations measured (``operations`` makes them for a message), in the order callgrind counts them
OPS = ("codec write", "JSON write", "codec read", "JSON read")
CALLGRIND_CALLS = 50  # calls per operation under callgrind (the count does not vary: few suffice)
#: what zstd costs: the medium task written and read with other compression settings
#: (name -> (codec.bounds.COMPRESS_MIN, codec.bounds.ZSTD_LEVEL))
VARIANTS = {
    "zstd level 3 (as stored)": (codec.bounds.COMPRESS_MIN, codec.bounds.ZSTD_LEVEL),
    "zstd level 1": (codec.bounds.COMPRESS_MIN, 1),
    "zstd level -1": (codec.bounds.COMPRESS_MIN, -1),
    "not compressed": (float("inf"), codec.bounds.ZSTD_LEVEL),
}


@contextmanager
def compression(minimum, level):
    """codec.bounds.COMPRESS_MIN and ZSTD_LEVEL set for a while (this thread's compressor anew)."""
    bounds = codec.bounds
    saved = bounds.COMPRESS_MIN, bounds.ZSTD_LEVEL
    bounds.COMPRESS_MIN, bounds.ZSTD_LEVEL = minimum, level
    bounds._local.__dict__.pop("zstd", None)
    try:
        yield
    finally:
        bounds.COMPRESS_MIN, bounds.ZSTD_LEVEL = saved
        bounds._local.__dict__.pop("zstd", None)


def messages() -> dict:
    """{name: kombu message dict} as kombu's virtual channel hands it to a transport (no
    delivery_tag: the transport stores none)."""
    from celery import Celery

    from .memory_tasks import TASK, task_arguments

    app = Celery("shop", set_as_current=False)
    rng = random.Random("codec_cpu")
    out = {}
    for size in ("small", "medium", "large"):
        args, kwargs = task_arguments(size, 1, rng)
        task_id = str(uuid.UUID(int=rng.getrandbits(128), version=4))
        sig = app.amqp.as_task_v2(task_id, TASK, args=args, kwargs=kwargs, origin="gen1234@worker-7")
        body = dumps(list(sig.body)).encode()
        out[size] = {
            "body": base64.b64encode(body).decode(),
            "content-encoding": "utf-8",
            "content-type": "application/json",
            "headers": json.loads(json.dumps(sig.headers)),
            "properties": {
                **sig.properties,
                "reply_to": str(uuid.UUID(int=rng.getrandbits(128), version=4)),
                "delivery_mode": 2,
                "delivery_info": {"exchange": "", "routing_key": "orders"},
                "priority": 3,
                "body_encoding": "base64",
            },
        }
    event = dumps({"event": "order.shipped", "order": "order-00000001", "carrier": "DHL", "parcels": 2}).encode()
    out["kombu"] = {
        "body": base64.b64encode(event).decode(),
        "content-encoding": "utf-8",
        "content-type": "application/json",
        "headers": {},
        "properties": {
            "delivery_mode": 2,
            "priority": 0,
            "body_encoding": "base64",
            "delivery_info": {"exchange": "events", "routing_key": "shipped"},
        },
    }
    return out


def operations(message: dict) -> dict:
    """{op name: a call of no arguments} for one message."""
    record, text = codec.encode(message), dumps(message)
    assert codec.decode(record) == message and loads(text) == message
    return {
        "codec write": lambda: codec.encode(message),
        "JSON write": lambda: dumps(message),
        "codec read": lambda: base64.b64decode(codec.decode(record)["body"]),
        "JSON read": lambda: base64.b64decode(loads(text)["body"]),
    }


def cpu_us(ops: dict, calls: int, rounds: int) -> dict:
    """{op: CPU µs per call}, best of ``rounds`` (the ops interleaved in each round)."""
    best = dict.fromkeys(ops, float("inf"))
    for _ in range(rounds):
        for name, fn in ops.items():
            fn()
            start = time.process_time()
            for _ in range(calls):
                fn()
            best[name] = min(best[name], time.process_time() - start)
    return {name: t / calls * 1e6 for name, t in best.items()}


def _count_child(path: str) -> None:
    """Under callgrind: each operation once to warm up, then CALLGRIND_CALLS calls inside one
    ``functools.reduce`` (the parent counts instructions inside that call alone)."""
    with open(path, "rb") as f:
        msgs = pickle.load(f)

    def count(fn):
        fn()
        functools.reduce(lambda acc, _: fn(), range(CALLGRIND_CALLS), None)

    for name in MESSAGES:
        for fn in operations(msgs[name]).values():
            count(fn)
    for setting in VARIANTS.values():
        with compression(*setting):
            ops = operations(msgs["medium"])
            count(ops["codec write"])
            count(ops["codec read"])


def instructions() -> dict | None:
    """{message: {op: instructions per call}} counted by callgrind, or None without valgrind."""
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "messages.pickle")
        with open(path, "wb") as f:
            pickle.dump(messages(), f)
        out = os.path.join(tmp, "cg.out")
        subprocess.run(
            [
                valgrind,
                "--tool=callgrind",
                "--collect-atstart=no",
                "--toggle-collect=functools_reduce",
                "--dump-after=functools_reduce",
                f"--callgrind-out-file={out}",
                sys.executable,
                "-c",
                f"from benchmarks.codec_cpu import _count_child; _count_child({path!r})",
            ],
            check=True,
            capture_output=True,
            cwd=Path(__file__).resolve().parent.parent,
        )
        dumps_ = sorted(Path(tmp).glob("cg.out.*"), key=lambda p: int(p.suffix[1:]))
        totals = []
        for dump in dumps_:
            for line in dump.read_text().splitlines():
                if line.startswith("totals:"):
                    totals.append(int(line.split()[1]))
    wanted = len(MESSAGES) * len(OPS) + 2 * len(VARIANTS)
    if len(totals) < wanted:
        return None
    per_call = iter([t / CALLGRIND_CALLS for t in totals[-wanted:]])  # the last ones are ours (an import
    # may have called reduce before)
    counts = {name: {op: next(per_call) for op in OPS} for name in MESSAGES}
    counts["medium, compression"] = {
        variant: {"codec write": next(per_call), "codec read": next(per_call)} for variant in VARIANTS
    }
    return counts


def run(calls=300, rounds=5, callgrind=1) -> dict:
    msgs = messages()
    sizes = {name: {"json_bytes": len(dumps(m)), "record_bytes": len(codec.encode(m))} for name, m in msgs.items()}
    for variant, setting in VARIANTS.items():
        with compression(*setting):
            sizes[f"medium, {variant}"] = len(codec.encode(msgs["medium"]))
    cpu = {name: cpu_us(operations(m), calls, rounds) for name, m in msgs.items()}
    counts = instructions() if callgrind else None
    return {
        "calls": calls,
        "rounds": rounds,
        "sizes": sizes,
        "cpu_us": cpu,
        "instructions": counts,
        "load": os.getloadavg()[0],
    }


def markdown(data) -> list[str]:
    rows = []
    for name in MESSAGES:
        c, s = data["cpu_us"][name], data["sizes"][name]
        row = [
            name,
            f"{s['json_bytes']:,} / {s['record_bytes']:,}",
            f"{c['codec write']:.1f}",
            f"{c['JSON write']:.1f}",
            f"{c['codec write'] / c['JSON write']:.2f}",
            f"{c['codec read']:.1f}",
            f"{c['JSON read']:.1f}",
            f"{c['codec read'] / c['JSON read']:.2f}",
        ]
        rows.append(row)
    lines = [
        f"# CPU of the stored form per message: codec against the JSON layout (load {data['load']:.1f})",
        "",
        *table(
            [
                "message",
                "bytes JSON / codec",
                "codec write µs",
                "JSON write µs",
                "ratio",
                "codec read µs",
                "JSON read µs",
                "ratio",
            ],
            rows,
        ),
        "",
        f"Process time, best of {data['rounds']} rounds of {data['calls']} calls, the layouts interleaved. "
        "Read: decode (or loads) and the body's base64 decode kombu makes next. Ratio: codec / JSON.",
        "",
    ]
    counts = data["instructions"]
    if counts:
        rows = [
            [
                name,
                *(f"{counts[name][op]:,.0f}" for op in OPS),
                f"{counts[name]['codec write'] / counts[name]['JSON write']:.2f}",
                f"{counts[name]['codec read'] / counts[name]['JSON read']:.2f}",
            ]
            for name in MESSAGES
        ]
        lines += [
            "## Instructions per call (callgrind; the same under any load)",
            "",
            *table(["message", *OPS, "write ratio", "read ratio"], rows),
            "",
        ]
        json_w, json_r = counts["medium"]["JSON write"], counts["medium"]["JSON read"]
        rows = [
            [
                variant,
                f"{data['sizes'][f'medium, {variant}']:,}",
                f"{c['codec write']:,.0f}",
                f"{c['codec write'] / json_w:.2f}",
                f"{c['codec read']:,.0f}",
                f"{c['codec read'] / json_r:.2f}",
            ]
            for variant, c in counts["medium, compression"].items()
        ]
        lines += [
            "## The medium task under other compression settings (instructions per call)",
            "",
            *table(["setting", "record bytes", "codec write", "/ JSON write", "codec read", "/ JSON read"], rows),
            "",
        ]
    else:
        lines += ["(valgrind not found, or --callgrind 0: no instruction counts)", ""]
    return lines


def main(argv=None):
    return cli(
        argv,
        __doc__,
        "codec_cpu",
        run,
        markdown,
        options=[("--calls", int, 300), ("--rounds", int, 5), ("--callgrind", int, 1)],
        smoke={"calls": 5, "rounds": 1, "callgrind": 0},
    )


if __name__ == "__main__":
    main()
