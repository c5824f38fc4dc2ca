"""What the release files must carry: ``python scripts/check-dist.py WHEEL SDIST`` (make release-check).

The wheel: every file of the package as the repository holds it (``git ls-files celery_pq``, or the
files on disk outside a checkout), so the Lua scripts and their includes, ``py.typed`` and the
dashboard's page are there, and nothing of the tests, benchmarks or examples. The sdist: the
license, the README, the changelog, ``pyproject.toml``, the docs and the package. Prints one line
per file and exits 1 when one is missing.
"""

from __future__ import annotations

import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SDIST_MUST_HAVE = ["LICENSE", "README.md", "CHANGELOG.md", "pyproject.toml", "docs/index.md"]


def package_files() -> set[str]:
    try:
        out = subprocess.run(
            ["git", "ls-files", "celery_pq"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout
        return set(out.split())
    except (OSError, subprocess.CalledProcessError):
        return {
            p.relative_to(ROOT).as_posix()
            for p in (ROOT / "celery_pq").rglob("*")
            if p.is_file() and "__pycache__" not in p.parts
        }


def main(wheel: str, sdist: str) -> int:
    in_wheel = set(zipfile.ZipFile(wheel).namelist())
    with tarfile.open(sdist) as tar:
        names = tar.getnames()
    top = names[0].split("/")[0]
    in_sdist = {name.removeprefix(top + "/") for name in names}
    wanted = package_files()
    problems = [f"wheel: {name} is missing" for name in sorted(wanted - in_wheel)]
    problems += [
        f"wheel: {name} is not part of the package"
        for name in sorted(in_wheel)
        if not name.startswith(("celery_pq/", "celery_pq-"))
    ]
    problems += [f"sdist: {name} is missing" for name in SDIST_MUST_HAVE if name not in in_sdist]
    problems += [f"sdist: {name} is missing" for name in sorted(wanted - in_sdist)]
    kinds = {
        "Lua scripts": sum(name.endswith(".lua") for name in in_wheel),
        "dashboard files": sum(name.startswith("celery_pq/ops/dashboard/static/") for name in in_wheel),
        "py.typed": int("celery_pq/py.typed" in in_wheel),
    }
    for line in problems:
        print(f"error: {line}", file=sys.stderr)
    if problems:
        return 1
    print(
        f"wheel: {len(in_wheel)} files, every one of the package's {len(wanted)} among them ("
        + ", ".join(f"{n} {kind}" for kind, n in kinds.items())
        + f"); sdist: {len(in_sdist)} entries with {', '.join(SDIST_MUST_HAVE)}"
    )
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__.splitlines()[0])
    sys.exit(main(sys.argv[1], sys.argv[2]))
