#!/usr/bin/env bash
# make release-check: the release files, built, checked, installed and run as a user would.
#
#   scripts/release-check.sh PYTHON
#
# PYTHON has `build` and `twine` (the [dev] extras: .venv/bin/python after make install). In a
# temporary directory, removed at the end: `python -m build` makes the wheel and the sdist,
# `twine check --strict` checks their metadata as PyPI would, scripts/check-dist.py checks what
# they carry (every file of the package in the wheel: Lua, py.typed, the dashboard's page), then a
# fresh virtualenv (not .venv) gets the WHEEL with its dependencies, and the demo runs from it
# (python -m celery_pq.demo) in an empty directory with no PYTHONPATH: nothing of the source tree
# is importable; the install holds none of the extras' packages (prometheus_client, rich, pyspark)
# and `pq metrics` says which extra it needs. The demo starts its own redis-server
# ($PQ_REDIS_SERVER, or PATH).
set -euo pipefail
py="${1:?usage: $0 PYTHON (a python with build and twine)}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
quietly="bash $root/scripts/quietly.sh"
work="$(mktemp -d "${TMPDIR:-/tmp}/celery-pq-release.XXXXXX")"
trap 'rm -rf "$work"' EXIT
SECONDS=0

cd "$root"
$quietly "$work/build.log" "building the wheel and the sdist (python -m build)" \
    "$py" -m build --outdir "$work/dist" .
wheel="$(echo "$work"/dist/*.whl)"
sdist="$(echo "$work"/dist/*.tar.gz)"
"$py" -m twine check --strict "$wheel" "$sdist"
"$py" scripts/check-dist.py "$wheel" "$sdist"

$quietly "$work/pip.log" "installing $(basename "$wheel") into a fresh virtualenv" \
    sh -c "'$py' -m venv '$work/venv' && '$work/venv/bin/python' -m pip install '$wheel'"
mkdir "$work/run"
cd "$work/run"
# no PYTHONPATH and an empty working directory: celery_pq can only come from the wheel
env -u PYTHONPATH -u PQ_DEMO_REDIS_URL "$work/venv/bin/python" -c '
import sys, celery_pq
where = celery_pq.__file__
if not where.startswith(sys.prefix):
    sys.exit(f"error: celery_pq was imported from {where}, not from the virtualenv {sys.prefix}")
print(f"celery-pq {celery_pq.__version__} imported from the virtualenv'"'"'s site-packages")
'
# the core installs celery, kombu, redis and zstandard (and theirs), none of the extras' packages
for extra in prometheus_client rich pyspark; do
    if "$work/venv/bin/python" -m pip show -q "$extra" >/dev/null 2>&1; then
        echo "error: pip install of the wheel brought $extra (an extra's package) into the core install" >&2
        exit 1
    fi
done
echo "the core install has no prometheus_client, rich or pyspark"
# a command of an extra says in one line which extra it needs
said="$(env -u PYTHONPATH "$work/venv/bin/python" -m celery_pq --broker pq://127.0.0.1:1/0 metrics 2>&1 || true)"
case "$said" in
    "Error: celery_pq.ops.metrics needs the [ops] extra"*) echo "pq metrics without [ops]: $said" ;;
    *) echo "error: pq metrics without the [ops] extra said: $said" >&2; exit 1 ;;
esac
env -u PYTHONPATH -u PQ_DEMO_REDIS_URL "$work/venv/bin/python" -m celery_pq.demo
echo "release check passed in ${SECONDS} s: $(basename "$wheel") and $(basename "$sdist") built, checked, installed, demo run"
