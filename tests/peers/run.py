"""Run a peer project's own test suite, unchanged, against ``pq://``.

    python -m tests.peers.run kombu|celery [--version 5.7.0] [--cache DIR] [--tests PATH ...]
        [--broker pq|redis] [--no-expected] [-- PYTEST ARGS]

For a peer (``PEERS``): the source distribution of its installed version (or ``--version``) is
downloaded once with pip (``pip download --no-binary :all: --no-deps``) into the cache
(``--cache``, else ``$PQ_PEER_CACHE``, else ``.venv/peers``) and unpacked there. Then either our
file of subclasses (``tests/peers/<peer>_pq.py``, kombu's way) is run with pytest, the unpacked
tree named in ``PQ_PEER_SOURCE``; or (``in_tree``, Celery's way) the peer's own test files are
run from its unpacked tree with its own conftest, our plugins named with ``-p``, and its
broker and result backend pointed at a redis-server started here. ``--broker redis`` runs the same
in-tree tests with kombu's own Redis transport (``redis://``) as the broker instead, for a
comparison (``tests/peers/contract.py``); ``--no-expected`` leaves the tests listed in
``expected_failures.txt`` unmarked (their plain outcome). Nothing of the peer's is
edited. Once cached, no network is needed. The tests that cannot pass are listed, each with its
reason, in ``expected_failures.txt``.

Exit status: pytest's (non-zero when a test fails, or an expected failure passes).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tarfile
from dataclasses import dataclass, replace
from importlib.metadata import version as installed_version
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BROKERS = ("pq", "redis")  # an in-tree run's broker URL schemes: ours, and kombu's own Redis transport


@dataclass(frozen=True)
class Peer:
    dist: str  # its distribution on PyPI (and the sdist's name)
    tests: tuple[str, ...]  # what pytest runs: our files (from the repository root) or, in_tree, the peer's
    needs: tuple[str, ...]  # files of the unpacked source the run needs
    in_tree: bool = False  # run from the unpacked tree, with its own conftest
    plugins: tuple[str, ...] = ()  # our pytest plugins for an in-tree run


PEERS = {
    "kombu": Peer("kombu", ("tests/peers/kombu_pq.py",), ("t/integration/common.py",)),
    # Celery's integration tests of canvas (groups, chords, chains, Task.replace), with the
    # prefork session worker its conftest starts, against pq:// and a Redis result backend
    "celery": Peer(
        "celery",
        ("t/integration/test_canvas.py",),
        ("t/integration/conftest.py", "t/integration/test_canvas.py"),
        in_tree=True,
        plugins=("celery.contrib.pytest", "tests.peers.celery_plugin", "tests.peers.expected"),
    ),
}


def sdist(peer: Peer, version: str, cache: Path) -> Path:
    """The peer's source distribution in ``cache``, downloaded when it is not there yet."""
    for found in sorted(cache.glob(f"{peer.dist}-{version}.tar.gz")):
        return found
    cache.mkdir(parents=True, exist_ok=True)
    print(f"peer {peer.dist}: downloading the {peer.dist}=={version} source distribution into {cache}", flush=True)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-binary",
            ":all:",
            "--no-deps",
            "--dest",
            str(cache),
            f"{peer.dist}=={version}",
        ],
        check=True,
    )
    for found in sorted(cache.glob(f"{peer.dist}-{version}.tar.gz")):
        return found
    raise SystemExit(f"peer {peer.dist}: pip left no {peer.dist}-{version}.tar.gz in {cache}")


def unpacked(peer: Peer, archive: Path) -> Path:
    """The source tree of ``archive`` (unpacked beside it once)."""
    tree = archive.parent / archive.name.removesuffix(".tar.gz")
    done = tree / ".unpacked"
    if not done.exists():
        with tarfile.open(archive) as tar:
            if hasattr(tarfile, "data_filter"):  # Python 3.11.4 on: no links or paths out of the tree
                tar.extractall(archive.parent, filter="data")
            else:
                if any(
                    m.name.startswith(("/", "..")) or ".." in Path(m.name).parts or m.islnk() or m.issym()
                    for m in tar.getmembers()
                ):
                    raise SystemExit(f"peer {peer.dist}: {archive.name} has a path or link out of its tree")
                tar.extractall(archive.parent)
        done.touch()
    missing = [f for f in peer.needs if not (tree / f).is_file()]
    if missing:
        raise SystemExit(f"peer {peer.dist}: {archive.name} has no {', '.join(missing)}")
    return tree


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(prog="python -m tests.peers.run", description=__doc__.split("\n\n")[0])
    parser.add_argument("peer", choices=sorted(PEERS))
    parser.add_argument("--version", help="the peer's version (default: the installed one)")
    parser.add_argument(
        "--cache",
        type=Path,
        default=Path(os.environ.get("PQ_PEER_CACHE") or ROOT / ".venv" / "peers"),
        help="where source distributions are kept (default: $PQ_PEER_CACHE or .venv/peers)",
    )
    parser.add_argument(
        "--tests", nargs="+", metavar="PATH", help="these of the peer's test files instead of the default ones"
    )
    parser.add_argument(
        "--broker",
        choices=BROKERS,
        default="pq",
        help="an in-tree peer's broker: pq:// (default) or kombu's own redis:// transport",
    )
    parser.add_argument(
        "--no-expected", action="store_true", help="do not mark the tests listed in expected_failures.txt"
    )
    args = parser.parse_args(argv)
    peer = PEERS[args.peer]
    if args.tests:
        peer = replace(peer, tests=tuple(args.tests))
    if args.no_expected or args.broker != "pq":
        peer = replace(peer, plugins=tuple(p for p in peer.plugins if p != "tests.peers.expected"))
    version = args.version or installed_version(peer.dist)
    tree = unpacked(peer, sdist(peer, version, args.cache.resolve()))
    print(f"peer {peer.dist} {version}: its own tests from {tree}, against {args.broker}://", flush=True)
    if not peer.in_tree:
        if args.broker != "pq":
            raise SystemExit(f"peer {peer.dist}: --broker is for the peers run from their own tree")
        env = {**os.environ, "PQ_PEER_SOURCE": str(tree)}
        return subprocess.call(
            [sys.executable, "-m", "pytest", *peer.tests, "-p", "no:cacheprovider", *extra], cwd=ROOT, env=env
        )
    return in_tree(peer, tree, extra, args.broker)


def in_tree(peer: Peer, tree: Path, extra: list[str], broker: str = "pq") -> int:
    """Run the peer's own test files from its tree, against ``broker``:// (pq:// or kombu's
    redis://) on a redis-server of our own (database 0 the broker, 1 the result backend; the
    tasks' own Redis client the same server)."""
    from celery_pq.testing import RedisServer

    with RedisServer() as server:
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
            "TEST_BROKER": f"{broker}://127.0.0.1:{server.port}/0",
            "TEST_BACKEND": f"redis://127.0.0.1:{server.port}/1",
            "REDIS_HOST": "127.0.0.1",
            "REDIS_PORT": str(server.port),
        }
        plugins = [arg for name in peer.plugins for arg in ("-p", name)]
        return subprocess.call(
            [sys.executable, "-m", "pytest", *peer.tests, "-p", "no:cacheprovider", *plugins, *extra], cwd=tree, env=env
        )


if __name__ == "__main__":
    sys.exit(main())
