# celery-pq developer entry points.
#
#   make demo    install into .venv, then run the demo (python -m celery_pq.demo: celery_pq/demo/)
#   make spark-demo  Spark -> tasks -> Celery workers -> event log -> Spark report (examples/spark_pipeline.py)
#   make test    install into .venv, then run the test suite in 2 processes (PYTEST_ARGS="-k lease -x"
#                to narrow, TEST_WORKERS=0 for one process)
#   make release-check  the wheel and the sdist built (python -m build) and checked (twine check,
#                scripts/check-dist.py: the Lua, py.typed, the dashboard in the wheel), the wheel
#                installed into a fresh virtualenv and the demo run from it, with no source tree
#                on the path (scripts/release-check.sh; about a minute)
#   make lint    ruff check, ruff format --check (celery_pq tests benchmarks examples) and mypy
#                (its configuration, like ruff's, in pyproject.toml); .ci/run runs it before the tests
#   make peers   kombu's own integration tests (from its source distribution, unchanged, downloaded
#                once into .venv/peers) against pq:// (tests/peers/run.py; PEERS="kombu celery" adds
#                Celery's test_canvas.py against pq:// alone)
#   make contract  Celery's own t/integration/test_tasks.py, test_canvas.py and test_inspect.py (its
#                sdist, unchanged) with kombu's redis:// and with pq:// as the broker, the two legs at
#                once, Redis the result backend: fails when a test passing with redis:// does not pass
#                with pq:// and is not listed in tests/peers/contract_expected.txt (tests/peers/contract.py;
#                about 20 minutes; logs in .venv/contract; CONTRACT_ARGS="--tests t/integration/test_inspect.py")
#   make bench   install into .venv, then run the benchmarks (benchmarks/run.py); BENCH_ARGS=--large
#                measures the flat costs at 10,000,000 entries and 100,000 tenants (about 3 GB of
#                Redis memory, several minutes more: not part of the plain run)
#   make soak    the model-based stateful test for SOAK_MINUTES (default 30) minutes, then the
#                fault suite's long runs (benchmarks/faults.py, about 7 minutes, and about 2 more for
#                each pool of SOAK_POOLS past prefork; results in SOAK_OUT)
#   make bench-rate  a global rate limit (task_rate, 20/s over 3 workers for 30 s) beside Celery's
#                per-worker rate_limit (benchmarks/rate_limits.py); RATE_ARGS="--seconds 10"
#   make profile where a client's time goes, ours and kombu's Redis transport (pyinstrument)
#   make compat  the versions pyproject.toml accepts, tried (noxfile.py: oldest and newest Celery and
#                kombu, each redis-py major with and without hiredis, Redis 7.0 and Valkey 8; one
#                virtualenv each under .nox; NOX_ARGS="-t ci" the two corners .ci/run runs)
#   make clean   remove .venv, build artefacts and caches
#
# The tests, the benchmarks and the demo start their own redis-server processes on
# free ports (celery_pq.testing); scripts/ensure-redis-server.sh finds (or, as root
# on Debian/Ubuntu, installs) the binary and its path is handed over in PQ_REDIS_SERVER.
# The Spark tests need Java 17: scripts/ensure-java.sh finds (or, as root on Debian/Ubuntu,
# installs) it, and its directory goes first on PATH. The targets begin with that preamble written
# once ($(WITH_REDIS), $(WITH_JAVA)); the ensure scripts share their skeleton (scripts/ensure-lib.sh).
#
# `make test` also makes sure Chromium and chromedriver are there for the dashboard's browser
# test (scripts/ensure-chromium.sh, which installs them as root on Debian/Ubuntu); when it
# cannot, the run goes on and that one test fails with the script's message.
#
# Installing says in one line what it installs; pip's output goes to .venv/pip.log
# and is printed in full only when pip fails (scripts/quietly.sh).

PYTHON      ?= python3
VENV        := .venv
VPY         := $(VENV)/bin/python
STAMP       := $(VENV)/.installed
BASE_STAMP  := $(VENV)/.installed-base
ENSURE_REDIS := bash scripts/ensure-redis-server.sh
ENSURE_JAVA := bash scripts/ensure-java.sh
ENSURE_CHROMIUM := bash scripts/ensure-chromium.sh
QUIETLY     := bash scripts/quietly.sh
# The preamble of every target that needs them, written once: the redis-server binary's path in
# PQ_REDIS_SERVER, java's directory first on PATH (and JAVA its path). Each ends a shell
# statement, so a recipe line begins with them: `@$(WITH_REDIS) $(WITH_JAVA) command`.
WITH_REDIS   = PQ_REDIS_SERVER="$$($(ENSURE_REDIS))" || exit 1; export PQ_REDIS_SERVER;
WITH_JAVA    = JAVA="$$($(ENSURE_JAVA))" || exit 1; export PATH="$$(dirname "$$JAVA"):$$PATH";
PYTEST_ARGS ?=
# pytest-xdist processes for `make test` (most of the suite waits on workers and servers; every
# test starts its own on free ports): TEST_WORKERS=0 runs it in one process
TEST_WORKERS ?= 2
PEERS       ?= kombu
CONTRACT_ARGS ?=
DEMO_ARGS   ?=
SPARK_DEMO_ARGS ?=
BENCH_ARGS  ?=
SOAK_MINUTES ?= 30
SOAK_OUT    ?= $${TMPDIR:-/tmp}/celery-pq-soak
# The worker pools the soak's worker_kills runs with, each in turn (benchmarks/faults.py --pools)
SOAK_POOLS  ?= prefork threads gevent eventlet

.PHONY: all venv install redis lint test peers contract soak demo spark-demo bench profile clean release-check

all: test

# Create the virtualenv once. On a fresh Debian/Ubuntu the venv module lives in
# the separate python3-venv package; install it when we are root and may.
$(VPY):
	@if ! $(PYTHON) -m venv $(VENV); then \
		rm -rf $(VENV); \
		if [ "$$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then \
			$(QUIETLY) "$${TMPDIR:-/tmp}/celery-pq-apt-venv.log" \
				"python3 -m venv failed; installing python3-venv with apt-get" \
				env DEBIAN_FRONTEND=noninteractive sh -c \
				'apt-get update && apt-get install -y python3-venv python3-pip' && \
			$(PYTHON) -m venv $(VENV); \
		else \
			echo "error: '$(PYTHON) -m venv' failed; install python3-venv (Debian/Ubuntu) and retry" >&2; \
			exit 1; \
		fi; \
	fi

# Reinstall only when pyproject.toml changed since the last install.
$(STAMP): pyproject.toml | $(VPY)
	@$(QUIETLY) $(VENV)/pip.log "installing celery-pq (editable) and its [dev] extras from pyproject.toml into $(VENV)" \
		sh -c '$(VPY) -m pip install --upgrade pip && $(VPY) -m pip install -e ".[dev]"'
	@touch $(STAMP)

# The demo needs the package alone (celery, kombu, redis), not the test and Spark extras.
$(BASE_STAMP): pyproject.toml | $(VPY)
	@if [ -f $(STAMP) ] && [ $(STAMP) -nt pyproject.toml ]; then touch $(BASE_STAMP); else \
	$(QUIETLY) $(VENV)/pip.log "installing celery-pq (editable, no extras) from pyproject.toml into $(VENV)" \
		sh -c '$(VPY) -m pip install --upgrade pip && $(VPY) -m pip install -e .' && touch $(BASE_STAMP); fi

install: $(STAMP)

venv: install

redis:
	@$(ENSURE_REDIS)

# What is linted and formatted: the package, its tests, the benchmarks and the examples; mypy
# checks the files pyproject.toml names ([tool.mypy] files); lint-imports holds the layers
# ([tool.importlinter]: the layers, no cycles, the core never importing the tools or Spark).
LINTED      := celery_pq tests benchmarks examples

lint: install
	$(VENV)/bin/ruff check $(LINTED)
	$(VENV)/bin/ruff format --check $(LINTED)
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

test: install
	@$(WITH_REDIS) $(WITH_JAVA) \
	echo "PQ_REDIS_SERVER=$$PQ_REDIS_SERVER java=$$JAVA"; \
	$(ENSURE_CHROMIUM) >/dev/null || echo "warning: the dashboard's browser test will fail (see above)" >&2; \
	$(VPY) -m pytest -n $(TEST_WORKERS) $(PYTEST_ARGS)

# The release files as a user gets them: built, checked, installed into a clean virtualenv in a
# temporary directory (never .venv), and the demo run from the installed wheel.
release-check: install
	@$(WITH_REDIS) \
	bash scripts/release-check.sh $(VPY)

# Each peer's own tests, unchanged, against pq://; the ones that cannot pass are listed with their
# reasons in tests/peers/expected_failures.txt. Celery's suite is `make contract`'s (against both
# brokers); `make peers PEERS="kombu celery"` still runs its test_canvas.py against pq:// alone.
peers: install
	@$(WITH_REDIS) \
	for peer in $(PEERS); do $(VPY) -m tests.peers.run $$peer || exit 1; done

# Celery's own suite against kombu's redis:// and pq:// in one run, compared (tests/peers/contract.py).
contract: install
	@$(WITH_REDIS) \
	$(VPY) -m tests.peers.contract $(CONTRACT_ARGS)

# tests/queue/test_model.py's machines in turn, with many long examples, until SOAK_MINUTES have passed.
soak: install
	@$(WITH_REDIS) \
	PQ_SOAK_MINUTES=$(SOAK_MINUTES) $(VPY) -m pytest tests/queue/test_model.py -m slow -p no:cacheprovider $(PYTEST_ARGS) && \
	$(VPY) -m benchmarks.faults --aof-rounds 60 --pools $(SOAK_POOLS) --out "$(SOAK_OUT)" && echo "fault suite results: $(SOAK_OUT)/faults.md"

demo: $(BASE_STAMP)
	@$(WITH_REDIS) \
	$(VPY) -m celery_pq.demo $(DEMO_ARGS)

# SPARK_DEMO_ARGS="--rows 2000" for a short run; the report lands in spark-demo/report.html
spark-demo: install
	@$(WITH_REDIS) $(WITH_JAVA) \
	$(VPY) -m examples.spark_pipeline $(SPARK_DEMO_ARGS)

bench: install
	@$(WITH_REDIS) $(WITH_JAVA) \
	$(VPY) -m benchmarks.run $(BENCH_ARGS)

# A global rate limit (task_rate) beside Celery's per-worker rate_limit, 3 workers, 30 s
# (benchmarks/rate_limits.py; results/rate_limits.md): RATE_ARGS="--rate 20 --seconds 30"
.PHONY: bench-rate
bench-rate: install
	@$(WITH_REDIS) \
	$(VPY) -m benchmarks.rate_limits $(RATE_ARGS)

profile: install
	@$(WITH_REDIS) \
	$(VPY) -m benchmarks.profile $(PROFILE_ARGS)

NOX_ARGS ?= -t compat
.PHONY: compat
# (pyenv's interpreters made visible to nox, where pyenv is there; a missing one fails the run)
compat: install
	@$(WITH_REDIS) \
	if command -v pyenv >/dev/null; then export PYENV_VERSION="$$(pyenv versions --bare | paste -sd:)"; fi; \
	$(VENV)/bin/nox --error-on-missing-interpreters $(NOX_ARGS)

clean:
	rm -rf $(VENV) .nox build dist *.egg-info .pytest_cache spark-warehouse metastore_db derby.log spark-demo
	find . -path ./.git -prune -o -type d -name __pycache__ -prune -exec rm -rf {} +

# A/B of the benchmarks (throughput, Celery solo and prefork-2, latency, fairness, memory) against an
# earlier tree, the two alternated in one session (benchmarks/ab.py; results/ab.md and ab.json):
#   make bench-ab BEFORE=rev [AB_ARGS="--only celery_e2e --repeat 5"]   (AB_ARGS=--smoke: a tiny run)
.PHONY: bench-ab
bench-ab: install
	@test -n "$(BEFORE)" || { echo "usage: make bench-ab BEFORE=rev [AB_ARGS=...]" >&2; exit 1; }
	@$(WITH_REDIS) \
	$(VPY) -m benchmarks.ab --before $(BEFORE) $(AB_ARGS)
