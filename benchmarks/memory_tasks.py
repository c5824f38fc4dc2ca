"""Redis memory per waiting task: celery-pq against kombu's Redis transport, side by side.

Realistic tasks published through Celery's ``apply_async`` (priorities 0-9) on one redis-server,
each transport and task size in turn on a fresh key space; the figure is the growth of
``used_memory``, less its clients' buffers (``common.data_memory``), per waiting task between a
warm-up of ``WARMUP`` tasks and ``tasks`` more:

- small:  ``process_order.apply_async(("order-00000001", 0.0), priority=...)`` (args only);
- medium: the same with about 1 KB of kwargs (an order: customer, address, a few line items);
- large:  a body of about 20 KB (an order of some 150 line items).

The kwargs are made of words, SKUs and figures drawn from a seeded generator, so they compress as
such records do, neither as noise nor as repeated text. celery-pq runs twice for medium and large:
with its zstd compression of large records, and with it off (``codec.bounds.COMPRESS_MIN`` out of reach),
which is what compression pays. After the small run, ``MEMORY USAGE`` of each key says where a
waiting task's bytes go; the stored forms of one task are compared too (kombu's JSON, celery-pq's
record; zstd, zstd with a trained dictionary and zlib on the medium and large records).

    python -m benchmarks.memory_tasks [--tasks 50000] [--warmup 1000] [--samples 2000] [--smoke] [--out DIR]
"""

from __future__ import annotations

import base64
import random
import time
import uuid
import zlib
from contextlib import contextmanager

import redis
import zstandard
from celery import Celery
from kombu.utils.json import dumps
from kombu.utils.json import loads as kombu_loads

import celery_pq  # noqa: F401  registers pq://
from celery_pq.storage import codec
from celery_pq.transport.messages import stored_item
from celery_pq.transport.options import Options

from .common import cli, data_memory, redis_server, table

TARGET = 0.4  # celery-pq bytes per waiting small task at most this times kombu-redis's
WARMUP = 1000  # tasks published before the first reading: key encodings settled
SAMPLES = 2000  # tasks of each size a compression dictionary is trained on
TASK = "shop.tasks.process_order"
SIZES = ("small", "medium", "large")
PREFIX = "mem"

_WORDS = [
    "red",
    "blue",
    "green",
    "large",
    "small",
    "cotton",
    "steel",
    "wooden",
    "classic",
    "modern",
    "deluxe",
    "basic",
    "travel",
    "kitchen",
    "garden",
    "office",
    "sport",
    "winter",
    "summer",
    "organic",
]
_CITIES = ["Lyon", "Porto", "Graz", "Ghent", "Turku", "Bergen", "Malmo", "Bilbao", "Utrecht", "Leipzig"]


def _item(rng) -> dict:
    return {
        "sku": f"SKU-{rng.randint(10000, 99999)}",
        "name": " ".join(rng.choices(_WORDS, k=3)),
        "qty": rng.randint(1, 5),
        "unit_price": round(rng.uniform(1, 200), 2),
        "discount": rng.choice([0, 0, 0.05, 0.1]),
    }


def _order(rng, items: int) -> dict:
    return {
        "customer": {
            "id": rng.randint(1, 10**7),
            "name": f"{rng.choice(_WORDS).title()} {rng.choice(_CITIES)}",
            "email": f"user{rng.randint(1, 10**6)}@example.com",
        },
        "address": {
            "street": f"{rng.randint(1, 300)} {rng.choice(_WORDS).title()} Street",
            "city": rng.choice(_CITIES),
            "zip": f"{rng.randint(10000, 99999)}",
            "country": "EU",
        },
        "items": [_item(rng) for _ in range(items)],
        "currency": "EUR",
        "channel": rng.choice(["web", "app"]),
    }


def task_arguments(size: str, n: int, rng) -> tuple[tuple, dict]:
    args = (f"order-{n:08d}", round(rng.uniform(0, 500), 2))
    if size == "small":
        return args, {}
    return args, {"order": _order(rng, 6 if size == "medium" else 150)}


def _app(url: str, options: dict) -> Celery:
    app = Celery("shop", broker=url, set_as_current=False)
    app.conf.broker_transport_options = options
    app.conf.task_default_queue = "orders"

    app.task(name=TASK)(process_order)
    return app


def process_order(order_id, amount, order=None):
    """The task (never run here: the tasks only wait)."""
    return order_id


@contextmanager
def _compression(on: bool):
    saved = codec.bounds.COMPRESS_MIN
    if not on:
        codec.bounds.COMPRESS_MIN = float("inf")
    try:
        yield
    finally:
        codec.bounds.COMPRESS_MIN = saved


def _clear(client) -> None:
    keys = list(client.scan_iter(count=1000))
    for i in range(0, len(keys), 500):
        client.delete(*keys[i : i + 500])


def measure(port: int, transport: str, size: str, tasks: int, warmup: int, compress: bool = True) -> dict:
    """used_memory growth per waiting task of one transport and task size."""
    client = redis.Redis(port=port)
    _clear(client)
    if transport == "celery-pq":
        app = _app(f"pq://127.0.0.1:{port}/0", {"key_prefix": PREFIX})
    else:
        app = _app(f"redis://127.0.0.1:{port}/0", {})
    task = app.tasks[TASK]
    rng = random.Random(size)
    with _compression(compress), app.producer_pool.acquire(block=True) as prod:

        def publish(start, count):
            for n in range(start, start + count):
                args, kwargs = task_arguments(size, n, rng)
                task.apply_async(args, kwargs, priority=n % 10, producer=prod)

        publish(0, warmup)
        before = data_memory(client)
        started = time.perf_counter()
        publish(warmup, tasks)
        elapsed = time.perf_counter() - started
        after = data_memory(client)
    keys = _key_usage(client)
    app.close()
    client.close()
    return {"bytes_per_task": (after - before) / tasks, "publish_per_second": tasks / elapsed, "keys": keys}


def _key_usage(client) -> dict:
    """{key: [type, encoding, length, MEMORY USAGE bytes]} of every key (all elements sampled)."""
    out = {}
    for key in client.scan_iter(count=1000):
        kind = client.type(key).decode()
        length = {
            "hash": client.hlen,
            "list": client.llen,
            "zset": client.zcard,
            "set": client.scard,
            "string": client.strlen,
        }.get(kind, lambda k: 0)(key)
        out[key.decode(errors="replace")] = [
            kind,
            client.object("encoding", key).decode(),
            length,
            client.memory_usage(key, samples=0) or 0,
        ]
    return out


def stored_forms(samples: int) -> dict:
    """One task of each size: kombu's JSON of it, celery-pq's record uncompressed and as stored,
    and the same record under zlib and a zstd dictionary trained on ``samples`` others."""
    app = _app("pq://127.0.0.1:1/0", {})
    options = Options.from_transport_options({})
    out = {}
    for size in SIZES:
        rng = random.Random(f"forms-{size}")
        messages = []
        for n in range(samples + 1):
            args, kwargs = task_arguments(size, n, rng)
            sig = app.amqp.as_task_v2(
                str(uuid.UUID(int=rng.getrandbits(128))), TASK, args=args, kwargs=kwargs, origin="gen1234@worker-7"
            )
            body = dumps(list(sig.body)).encode()
            messages.append(
                {
                    "body": base64.b64encode(body).decode(),
                    "content-encoding": "utf-8",
                    "content-type": "application/json",
                    "headers": sig.headers,
                    "properties": {
                        **sig.properties,
                        "reply_to": "9b1deb4d-3b7d-4bad-9bdd-2b0d7b3dcb6d",
                        "delivery_mode": 2,
                        "priority": n % 10,
                        "body_encoding": "base64",
                        "delivery_info": {"exchange": "", "routing_key": "orders"},
                        "delivery_tag": "1e6b7c32-51ad-4a5a-9a45-9a43c1e0f2c1",
                    },
                }
            )
        sample = messages[-1]
        with _compression(False):
            plain = codec.encode(sample)[2:]
            training = [codec.encode(m)[2:] for m in messages[:-1]]
        stored = stored_item("orders", sample, options, lambda b, e: b).payload
        try:
            zdict = zstandard.train_dictionary(16_384, training)
            with_dict = (
                len(zstandard.ZstdCompressor(level=codec.bounds.ZSTD_LEVEL, dict_data=zdict).compress(plain)) + 2
            )
        except zstandard.ZstdError:  # too few samples (a smoke run)
            with_dict = None
        t0 = time.perf_counter()
        compressor = zstandard.ZstdCompressor(level=codec.bounds.ZSTD_LEVEL)
        for _ in range(200):
            compressor.compress(plain)
        zstd_us = (time.perf_counter() - t0) / 200 * 1e6
        t0 = time.perf_counter()
        for _ in range(200):
            zlib.compress(plain, 6)
        zlib_us = (time.perf_counter() - t0) / 200 * 1e6
        stored_json = dumps(sample)
        cpu = {
            "kombu_dumps_us": _cpu_us(lambda: dumps(sample)),
            "encode_us": _cpu_us(lambda: codec.encode(sample)),
            "kombu_loads_us": _cpu_us(lambda: kombu_loads(stored_json)),
            "decode_us": _cpu_us(lambda: codec.decode(stored)),
        }
        out[size] = {
            **cpu,
            "kombu_json": len(stored_json),
            "celery_pq_uncompressed": len(plain) + 2,
            "celery_pq_stored": len(stored),
            "zstd": len(zstandard.ZstdCompressor(level=codec.bounds.ZSTD_LEVEL).compress(plain)) + 2,
            "zstd_dictionary": with_dict,
            "zlib": len(zlib.compress(plain, 6)) + 2,
            "zstd_us": zstd_us,
            "zlib_us": zlib_us,
        }
    return out


def _cpu_us(fn, number: int = 300) -> float:
    """CPU microseconds per call of ``fn`` (process time: less moved by other load than wall time)."""
    best = float("inf")
    for _ in range(3):
        start = time.process_time()
        for _ in range(number):
            fn()
        best = min(best, time.process_time() - start)
    return best / number * 1e6


def run(tasks=50_000, warmup=WARMUP, samples=SAMPLES) -> dict:
    results = {}
    with redis_server() as port:
        for size in SIZES:
            row = {
                "kombu-redis": measure(port, "kombu-redis", size, tasks, warmup),
                "celery-pq": measure(port, "celery-pq", size, tasks, warmup),
            }
            if size != "small":
                row["celery-pq, no compression"] = measure(port, "celery-pq", size, tasks, warmup, compress=False)
            results[size] = row
    forms = stored_forms(samples)
    summary = {
        size: {name: {k: v for k, v in r.items() if k != "keys"} for name, r in row.items()}
        for size, row in results.items()
    }
    for size, row in summary.items():
        row["ratio"] = row["celery-pq"]["bytes_per_task"] / row["kombu-redis"]["bytes_per_task"]
    where = {name: results["small"][name]["keys"] for name in ("celery-pq", "kombu-redis")}
    return {
        "tasks": tasks,
        "warmup": warmup,
        "samples": samples,
        "target": TARGET,
        "results": summary,
        "small_keys": where,
        "stored_forms": forms,
    }


def _where_rows(keys: dict, tasks: int) -> list[list[str]]:
    rows = []
    for key, (kind, enc, length, usage) in sorted(keys.items(), key=lambda kv: -kv[1][3]):
        if usage * 100 < tasks:  # under 0.01 byte per task
            continue
        rows.append([f"`{key}`", f"{kind} ({enc})", f"{length:,}", f"{usage:,}", f"{usage / tasks:.1f}"])
    return rows


def markdown(data) -> list[str]:
    n = data["tasks"]
    rows = []
    for size, row in data["results"].items():
        nc = row.get("celery-pq, no compression")
        rows.append(
            [
                size,
                f"{row['celery-pq']['bytes_per_task']:.0f}",
                f"{row['kombu-redis']['bytes_per_task']:.0f}",
                f"{row['ratio']:.2f}",
                f"{nc['bytes_per_task']:.0f}" if nc else "-",
                f"{row['celery-pq']['publish_per_second']:,.0f}",
                f"{row['kombu-redis']['publish_per_second']:,.0f}",
            ]
        )
    forms = [
        [
            size,
            *(
                f"{f[k]:,}" if f[k] is not None else "-"
                for k in ("kombu_json", "celery_pq_uncompressed", "celery_pq_stored", "zstd", "zstd_dictionary", "zlib")
            ),
            f"{f['zstd_us']:.0f} / {f['zlib_us']:.0f}",
        ]
        for size, f in data["stored_forms"].items()
    ]
    total = n + data["warmup"]
    return [
        f"# Redis memory per waiting task ({n:,} tasks through Celery apply_async, after {data['warmup']:,})",
        "",
        *table(
            [
                "task",
                "celery-pq bytes/task",
                "kombu-redis bytes/task",
                "ratio",
                "celery-pq without compression",
                "celery-pq publish/s",
                "kombu-redis publish/s",
            ],
            rows,
        ),
        "",
        f"Goal: small tasks at most {data['target']}x kombu-redis's bytes. Publish rates are of this "
        "measurement (one process, one task at a time), not a throughput benchmark.",
        "",
        "## One task's stored form, bytes",
        "",
        *table(
            [
                "task",
                "kombu JSON",
                "celery-pq record",
                "celery-pq stored",
                "zstd",
                "zstd + dictionary",
                "zlib",
                "µs to compress zstd / zlib",
            ],
            forms,
        ),
        "",
        "CPU per message, µs (process time, best of 3 x 300 calls):",
        "",
        *table(
            ["task", "kombu JSON dumps", "codec.encode", "kombu JSON loads", "codec.decode"],
            [
                [size, *(f"{f[k]:.1f}" for k in ("kombu_dumps_us", "encode_us", "kombu_loads_us", "decode_us"))]
                for size, f in data["stored_forms"].items()
            ],
        ),
        "",
        "celery-pq stored: the record as the transport writes it (no delivery_tag; compressed from "
        f"{codec.bounds.COMPRESS_MIN} bytes when that is smaller).",
        "",
        f"## Where a small task's bytes go ({total:,} waiting tasks; MEMORY USAGE of each key)",
        "",
        "celery-pq:",
        "",
        *table(
            ["key", "type (encoding)", "length", "bytes", "bytes per task"],
            _where_rows(data["small_keys"]["celery-pq"], total),
        ),
        "",
        "kombu-redis:",
        "",
        *table(
            ["key", "type (encoding)", "length", "bytes", "bytes per task"],
            _where_rows(data["small_keys"]["kombu-redis"], total),
        ),
    ]


def main(argv=None):
    return cli(
        argv,
        __doc__,
        "memory_tasks",
        run,
        markdown,
        options=[("--tasks", int, 50_000), ("--warmup", int, WARMUP), ("--samples", int, SAMPLES)],
        smoke={"tasks": 100, "warmup": 20, "samples": 20},
    )


if __name__ == "__main__":
    main()
