# The README's two commands: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: help install dist test test-passes test-unit test-faults test-cluster test-broker test-matrix test-sim43 test-celery-upstream first-hour rabbitmq4 rabbitmq4-stop test-rabbitmq4 test-rabbitmq4-tiers test-rabbitmq4-nodes test-sim40 rabbitmq43 rabbitmq43-stop test-rabbitmq43 test-rabbitmq43-tiers test-rabbitmq43-nodes demo lint docs diagrams bench bench-quick bench-index clean

help:
	@echo "make demo   - schedule mixed delays and watch them arrive (RabbitMQ, or the simulator)"
	@echo "make test   - install into .venv; run every tier but faults and cluster, in parallel (needs RabbitMQ; each run timed in docs/_data/run-times.json)"
	@echo "make first-hour - the README's commands and the quickstarts in order, failing on any warning or error (needs RabbitMQ)"
	@echo "make test-unit - the tests that need no broker, no Celery worker and no process of their own (seconds)"
	@echo "make test-faults - crash, restart and consumer_timeout tests on a private RabbitMQ node (about 6 min)"
	@echo "make test-cluster - node failures on a private three-node RabbitMQ cluster; prints the failure matrix"
	@echo "make test-sim43 - the simulator half of the suite, the simulator behaving as RabbitMQ 4.3"
	@echo "make test-matrix - Celery tier + Django tests on Celery 5.3-5.7, Django 4.2-6.1, Python 3.9-3.13 (STACKS=...)"
	@echo "make test-celery-upstream - Celery's own integration tests of ETA, retry, expires, revoke: plain vs ladder (Redis)"
	@echo "make rabbitmq4 - start RabbitMQ 4.0 beside the system's 3.10 (a Debian 13 root; 127.0.0.1:5673); rabbitmq4-stop"
	@echo "make test-rabbitmq4 - the broker, Celery and process tiers, then the fault and cluster suites, on RabbitMQ 4.0"
	@echo "                      (test-rabbitmq4-tiers, test-rabbitmq4-nodes, test-sim40: its parts)"
	@echo "make rabbitmq43 - start RabbitMQ 4.3 beside them (a Debian sid root; 127.0.0.1:5674); rabbitmq43-stop"
	@echo "make test-rabbitmq43 - the same on RabbitMQ 4.3, the newest series: what CI runs beside 3.10"
	@echo "                      (test-rabbitmq43-tiers, test-rabbitmq43-nodes, test-sim43: its parts)"
	@echo "make dist   - sdist and wheel in dist/, twine check, then each extra in a clean venv runs the quickstarts (2-3.5 min)"
	@echo "make lint   - ruff and mypy"
	@echo "make docs   - build the Sphinx docs with -W"
	@echo "make bench  - benchmarks vs every alternative (bench-quick: a few minutes)"
	@echo "make bench-index - the index's store at 10 M entries, memory per live cancellation"

$(STAMP): setup.cfg pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# The distribution was called 'ladder' before 0.1.0 was published: drop that install from an older .venv,
	# and its metadata from the checkout, where 'python -m pytest' would find it and load the plugins twice.
	$(PY) -m pip uninstall --quiet --yes ladder 2>/dev/null || true
	rm -rf ladder.egg-info
	$(PY) -m pip install --quiet -e '.[celery,test,docs,django,lint,bench,prometheus,web,webtest]'
	touch $(STAMP)

install: $(STAMP)

# In parallel (pytest-xdist: the suite mostly waits, and each test has a vhost of its own), then the few files
# marked serial alone (tests/README.md, "In parallel"). TEST_WORKERS=0 runs the first pass in this process.
TEST_WORKERS ?= 3
# Timed: tests/run_times.py records the minutes and the load average in docs/_data/run-times.json (README).
test: $(STAMP)
	$(PY) tests/run_times.py make-test $(TEST_WORKERS) -- $(MAKE) --no-print-directory test-passes

test-passes: $(STAMP)
	$(PY) -m pytest -ra -n $(TEST_WORKERS) --dist loadgroup -m "not serial" --ignore=tests/faults --ignore=tests/cluster $(PYTEST_ARGS); \
	first=$$?; \
	$(PY) -m pytest -ra -m serial --ignore=tests/faults --ignore=tests/cluster $(PYTEST_ARGS); \
	second=$$?; [ $$second -eq 5 ] && second=0; \
	[ $$first -eq 0 ] && [ $$second -eq 0 ]

# The unit tier: every test tests/conftest.py marks "unit" (no broker, no Celery worker, no process or
# socket of its own; the simulator counts as pure). Needs no RabbitMQ; a few seconds. All of tests/unit
# (pure tables) and tests/sim (the simulator) is in it, and the pure tests and simulator twins of the
# other tiers (tests/README.md).
test-unit: $(STAMP)
	$(PY) -m pytest -q -m unit --ignore=tests/faults --ignore=tests/cluster $(PYTEST_ARGS)

# Destructive fault tests: they boot a private RabbitMQ node of their own (as root or the
# rabbitmq user), kill relays and workers, restart that node. Figures: build/fault-figures.txt
test-faults: $(STAMP)
	$(PY) -m pytest -ra tests/faults $(PYTEST_ARGS)

# A private three-node RabbitMQ cluster on loopback (root or the rabbitmq user), torn down afterwards:
# node restarts and a quorum leader kill -9 with relays on different nodes. Matrix: build/cluster-matrix.txt
test-cluster: $(STAMP)
	$(PY) -m pytest -ra tests/cluster $(PYTEST_ARGS)

# The simulator half of the suite (every test on the simulator backend or its fixtures) with the
# simulator behaving as RabbitMQ 4.3: refusing x-queue-mode, x-queue-version=1 and transient
# non-exclusive queues, applying global QoS per consumer. Needs no broker.
test-sim43: $(STAMP)
	$(PY) -m pytest -ra --ignore=tests/faults --ignore=tests/cluster -m unit -k simulator --ladder-rabbitmq=4.3 $(PYTEST_ARGS)

# One virtualenv per supported stack in .matrix/ (reused while its pins and setup.cfg are unchanged);
# the real-worker and Django tests in each; one line per stack. STACKS="celery5.3 celery5.7" picks some.
test-matrix:
	$(PYTHON) .ci/matrix.py $(STACKS)

# Celery's own integration tests (from the installed release's sdist) that involve countdown, eta, retry,
# expires and revoke, run plain and with the ladder; any test whose outcome differs fails it. Needs RabbitMQ,
# rabbitmqctl and Redis at 127.0.0.1:6379 (LADDER_UPSTREAM_REDIS); builds build/upstream/ once. tests/upstream/README.md
test-celery-upstream: $(STAMP)
	$(PY) tests/upstream/run.py $(PYTEST_ARGS)

# RabbitMQ 4.0 beside the system's 3.10: .ci/rabbitmq-alt builds a Debian 13 root (or, on Debian 13,
# a Debian 12 root for 3.10) and runs its node on 127.0.0.1:5673. Idempotent.
ALT_ENV = eval "$$(.ci/rabbitmq-alt env 4)"
rabbitmq4:
	.ci/rabbitmq-alt start

rabbitmq4-stop:
	.ci/rabbitmq-alt stop

# Every test that talks to a broker, on RabbitMQ 4.0: the broker, Celery and process tiers (the unit
# tier has no broker to differ, nor has building the distribution), then the fault and cluster suites
# on private 4.0 nodes from the same root, then the simulator half as 4.0 behaves.
test-rabbitmq4: test-rabbitmq4-tiers test-rabbitmq4-nodes test-sim40

test-rabbitmq4-tiers: $(STAMP) rabbitmq4
	$(ALT_ENV) && $(PY) -m pytest -ra --ignore=tests/faults --ignore=tests/cluster \
		--ignore=tests/process/test_packaging.py --ignore=tests/process/test_dist.py -m "not unit" --ladder-rabbitmq=4.0 $(PYTEST_ARGS)

test-rabbitmq4-nodes: $(STAMP) rabbitmq4
	$(ALT_ENV) && $(PY) -m pytest -ra tests/faults tests/cluster $(PYTEST_ARGS)

# RabbitMQ 4.3, the newest series (what CI runs beside the oldest, 3.10): .ci/rabbitmq-alt builds a Debian sid
# root (Erlang 29) and runs its node on 127.0.0.1:5674, beside 4.0's; the root is upgraded when sid has a newer
# rabbitmq-server, and a newer series than 4.3 runs with a warning and the 4.3 profile. Idempotent.
ALT43_ENV = eval "$$(.ci/rabbitmq-alt env 4.3)"
rabbitmq43:
	.ci/rabbitmq-alt start 4.3

rabbitmq43-stop:
	.ci/rabbitmq-alt stop 4.3

test-rabbitmq43: test-rabbitmq43-tiers test-rabbitmq43-nodes test-sim43

# The simulator fixtures behave as the profile .ci/rabbitmq-alt names for the installed release
# (LADDER_SIMULATOR_RABBITMQ: 4.3, or the nearest one to a newer series).
# In parallel as make test runs (TIER_WORKERS xdist workers; 0: in this process), then the serial files alone.
TIER_WORKERS ?= 2
test-rabbitmq43-tiers: $(STAMP) rabbitmq43
	$(ALT43_ENV) && $(PY) -m pytest -ra -n $(TIER_WORKERS) --dist loadgroup --ignore=tests/faults --ignore=tests/cluster \
		--ignore=tests/process/test_packaging.py --ignore=tests/process/test_dist.py -m "not unit and not serial" \
		$(PYTEST_ARGS); \
	first=$$?; \
	$(ALT43_ENV) && $(PY) -m pytest -ra --ignore=tests/faults --ignore=tests/cluster -m "serial and not unit" $(PYTEST_ARGS); \
	second=$$?; [ $$second -eq 5 ] && second=0; \
	[ $$first -eq 0 ] && [ $$second -eq 0 ]

# Private 4.3 nodes from the same root; 4.3 keeps its metadata in Khepri only (the clusters too).
test-rabbitmq43-nodes: $(STAMP) rabbitmq43
	$(ALT43_ENV) && $(PY) -m pytest -ra tests/faults tests/cluster $(PYTEST_ARGS)

# The distribution (kombu-ladder is not on the package index yet: this is what would be uploaded). sdist and
# wheel in dist/, 'twine check --strict', then tests/process/test_dist.py on what was built: the wheel in a clean
# virtualenv per extra (none, celery, django, prometheus) and the sdist in another; the quickstarts run from
# them against RabbitMQ. Measured 2026-12-07 on two shared cores: 124 s with pip's cache warm, 135 s with
# PIP_NO_CACHE_DIR=1 (packages from the index again); a new user's first run on a loaded machine took 206 s.
dist: $(STAMP)
	rm -rf dist
	mkdir -p build && flock build/distribution.lock $(PY) -m build --outdir dist .  # one build at a time here (tests/helpers.py)
	$(VENV)/bin/twine check --strict dist/*
	LADDER_DIST=dist $(PY) -m pytest -ra tests/process/test_dist.py $(PYTEST_ARGS)

# The simulator half of the suite with the simulator behaving as RabbitMQ 4.0 (what
# tests/broker/test_simulator_fidelity.py checks against the real 4.0). Needs no broker.
test-sim40: $(STAMP)
	$(PY) -m pytest -ra --ignore=tests/faults --ignore=tests/cluster -m unit -k simulator --ladder-rabbitmq=4.0 $(PYTEST_ARGS)

demo: $(STAMP)
	$(PY) examples/demo.py

# The README's commands and the quickstarts, in order, on a fresh vhost, as a new user runs them; any warning or
# error they print fails it (tests/process/test_first_hour.py). Needs RabbitMQ; a few minutes.
first-hour: $(STAMP)
	$(PY) -m pytest -ra -p no:randomly tests/process/test_first_hour.py $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check kombu_ladder celery_ladder tests
	$(VENV)/bin/mypy

docs: $(STAMP)
	$(VENV)/bin/sphinx-build -W --keep-going -b html docs docs/_build/html

# The committed docs/_static/ladder.svg is made from docs/diagrams/ladder.dot (needs graphviz).
diagrams:
	dot -Tsvg docs/diagrams/ladder.dot -o docs/_static/ladder.svg

# Benchmarks against every alternative (needs RabbitMQ and rabbitmqctl); both write docs/benchmarks.md
# and docs/_static/lateness.png. bench-quick is a reduced run of a few minutes.
bench: $(STAMP)
	$(PY) -m bench

bench-quick: $(STAMP)
	$(PY) -m bench --quick

# The index's store at ten million entries and the live set's memory (no broker; about an hour on two loaded cores):
# writes docs/_data/bench-index-store.json and its section of docs/benchmarks.md.
bench-index: $(STAMP)
	$(PY) -m bench.index_store

clean:
	rm -rf $(VENV) build dist *.egg-info docs/_build .pytest_cache .matrix
