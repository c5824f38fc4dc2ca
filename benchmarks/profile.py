"""Where a client's time goes: pyinstrument over publish and over consume + ack (prefetch 1)
through kombu, for celery-pq and kombu's Redis transport, against one redis-server started for
the run. Writes ``results/profile.md`` (the top of each profile) and the full text profiles as
``results/profile-<transport>-<phase>.txt``.

    python -m benchmarks.profile [--messages 5000] [--smoke] [--out DIR]

A profile is a tool to find the next thing to make faster; it asserts nothing and its figures
are not targets (pyinstrument samples every millisecond, which slows the run a little).
"""

from __future__ import annotations

from pathlib import Path

from kombu import Connection, Consumer, Exchange, Producer, Queue
from pyinstrument import Profiler

import celery_pq  # noqa: F401  (pq:// scheme)

from .common import RESULTS, cli, redis_server, transports

BODY = "x" * 256
QUEUE = Queue("prof", Exchange("prof"), routing_key="prof")


def _publish(conn, n):
    producer = Producer(conn.default_channel)
    for _ in range(n):
        producer.publish(BODY, exchange=QUEUE.exchange, routing_key="prof", priority=5)


def _consume(conn, n):
    got = [0]

    def on_message(body, message):
        got[0] += 1
        message.ack()

    with Consumer(conn, [QUEUE], callbacks=[on_message], prefetch_count=1):
        while got[0] < n:
            try:
                conn.drain_events(timeout=5)
            except TimeoutError:
                break
    return got[0]


ROOT = str(Path(__file__).resolve().parent.parent) + "/"


def _text(profiler) -> str:
    """The whole tree, paths shown relative to the repository."""
    return profiler.output_text(unicode=False, color=False, show_all=True).replace(ROOT, "")


def _top(profiler, lines=45) -> str:
    return "\n".join(_text(profiler).splitlines()[:lines])


def run(messages=5000, out=None) -> dict:
    out = Path(out) if out else RESULTS
    out.mkdir(parents=True, exist_ok=True)
    data = {"messages": messages, "profiles": {}}
    with redis_server() as port:
        for name, (url, kwargs) in transports(port).items():
            with Connection(url, **kwargs) as conn:
                QUEUE(conn.default_channel).declare()
                QUEUE(conn.default_channel).purge()
                for phase, work in (("publish", _publish), ("consume", _consume)):
                    profiler = Profiler(interval=0.001)
                    profiler.start()
                    work(conn, messages)
                    profiler.stop()
                    path = out / f"profile-{name}-{phase}.txt"
                    path.write_text(_text(profiler))
                    data["profiles"][f"{name} {phase}"] = {"file": path.name, "top": _top(profiler)}
    return data


def markdown(data) -> list[str]:
    lines = [f"# Client profiles (pyinstrument, {data['messages']} messages, 256-byte bodies)"]
    for title, row in data["profiles"].items():
        lines += ["", f"## {title}", "", f"Full profile: `{row['file']}`", "", "```", row["top"], "```"]
    return lines


def main(argv=None):
    return cli(
        argv,
        __doc__,
        "profile",
        run,
        markdown,
        options=[("--messages", int, 5000)],
        smoke={"messages": 200},
        run_gets_out=True,
    )


if __name__ == "__main__":
    main()
