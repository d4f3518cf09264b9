# One way to run every check, the same locally and in CI.
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SERVICES := bash deploy/local/services.sh
# Service addresses: the local script's unless already set in the environment. Ports in use?
# POSTBACKS_KAFKA_PORT (19092), POSTBACKS_KAFKA_CONTROLLER_PORT (19093) and POSTBACKS_PG_PORT
# (15432) move the local services; POSTBACKS_CLUSTER_PORT (29092: ports 29092-29097) moves
# `make cluster-up`'s three brokers (the broker-kill test of `make test` picks free ports).
export KAFKA_BOOTSTRAP_SERVERS ?= 127.0.0.1:$(or $(POSTBACKS_KAFKA_PORT),19092)
export POSTBACKS_KAFKA_REPLICATION ?= dev
export POSTBACKS_DATABASE_URL ?= postgresql://postbacks@127.0.0.1:$(or $(POSTBACKS_PG_PORT),15432)/postbacks
PYTEST_ARGS ?=

.PHONY: help install check lint typecheck rules prometheus test test-unit test-cluster demo services-up \
        services-down services-status browser bench bench-copy bench-avro bench-avro-choice \
        bench-framing bench-services bench-migrations bench-http-choice bench-rows clean

help:
	@echo "make demo            run the whole pipeline on local services (the main job)"
	@echo "make test            start services and run every test tier"
	@echo "make test-unit       unit + contract tiers only (no services)"
	@echo "make test-cluster    the three-broker kill test alone (make test runs it too)"
	@echo "make check           ruff + mypy (strict) + the alert rules (promtool check and test)"
	@echo "make lint            ruff alone"
	@echo "make typecheck       mypy (strict) alone"
	@echo "make rules           alert and recording rules (promtool check, test), scrape config"
	@echo "make install         the virtualenv .venv: the package, its Avro C extension, dev tools"
	@echo "make services-up     start Kafka and PostgreSQL (deploy/local/services.sh)"
	@echo "make services-down   stop them"
	@echo "make services-status exit non-zero unless both are ready"
	@echo "make cluster-up      a three-broker Kafka cluster beside the single broker (29092-29097)"
	@echo "make cluster-down    stop it"
	@echo "make k8s-check       deploy/k8s/ against the Kubernetes schemas, offline"
	@echo "make browser         install Debian's chromium (console browser tests)"
	@echo "make prometheus      install Debian's prometheus (server + promtool)"
	@echo "make clean           remove .venv, the caches and the built Avro extension"
	@echo "make bench           the delivery benchmark (bench/delivery.py; BENCH_ARGS=...,"
	@echo "                    e.g. BENCH_ARGS='--parts gate' for the gate against the engine)"
	@echo "make bench-copy      the sink's write path alone (bench/copy_rows.py)"
	@echo "make bench-avro      the Avro codec alone, C against fastavro (bench/avro_codec.py)"
	@echo "make bench-avro-choice  the Avro codec on the whole pipeline, C against fastavro"
	@echo "make bench-framing   wire framing: bytes and µs per record (no services)"
	@echo "make bench-services  services.sh up -> ready, on a second pair of ports"
	@echo "make bench-migrations  the migrations: Alembic against a hand-written runner"
	@echo "make bench-http-choice  the agent's HTTP client: own HTTP/1 against aiohttp and httpx"
	@echo "make bench-rows      bytes per row as stored in PostgreSQL (bench/row_sizes.py)"

# The Avro codec's extension is built by the install: gone (make clean, a fresh clone), reinstall.
ifeq ($(wildcard postbacks/avro_c.*.so),)
$(shell rm -f $(STAMP))
endif

$(STAMP): pyproject.toml setup.py postbacks/avro_c.pyx
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "Python 3.11+ is required"'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip || true
	for i in 1 2 3; do $(BIN)/pip install -q -e '.[dev]' && break; \
	  echo "pip install failed (try $$i), retrying" >&2; sleep $$((i * 5)); \
	  [ $$i -lt 3 ] || exit 1; done
	touch $(STAMP)

install: $(STAMP)

lint: install
	$(BIN)/ruff check postbacks streams topics sinks replay_console schemas tests bench

typecheck: install
	$(BIN)/mypy

rules: prometheus  # the alert and recording rules: syntax, promtool unit tests, scrape config
	promtool check rules deploy/prometheus/rules.yml
	promtool test rules deploy/prometheus/tests/rules_test.yml
	promtool check config deploy/prometheus/prometheus.yml
	promtool check config deploy/prometheus/prometheus-compose.yml

prometheus:  # Debian's prometheus (server + promtool), for the rules and the alert tests
	$(SERVICES) prometheus

check: lint typecheck rules

services-up:
	$(SERVICES) up

services-down:
	$(SERVICES) down

services-status:
	$(SERVICES) status

test-unit: install
	$(BIN)/pytest tests/unit tests/contract $(PYTEST_ARGS)

browser:
	$(SERVICES) browser

test: install services-up browser prometheus
	$(BIN)/pytest tests/unit tests/contract tests/integration tests/e2e $(PYTEST_ARGS)

test-cluster: install services-up  # the three-broker kill test alone (its own cluster)
	$(BIN)/pytest tests/e2e -m cluster -s $(PYTEST_ARGS)

demo: install
	$(BIN)/postbacks demo

bench: install services-up
	$(BIN)/python bench/delivery.py $(BENCH_ARGS)

bench-avro: install  # the Avro codec alone (no services)
	$(BIN)/python bench/avro_codec.py

bench-copy: install services-up  # the sink's write path alone: binary vs text COPY, indexes
	$(BIN)/python bench/copy_rows.py --part formats
	$(BIN)/python bench/copy_rows.py --part indexes --rounds 3

bench-avro-choice: install services-up  # the Avro codec on the whole pipeline, alternating
	$(BIN)/python bench/avro_choice.py --rounds 3

bench-framing: install  # wire framing: bytes and µs per record (no services)
	$(BIN)/python bench/framing.py

bench-services: install services-up  # a second pair of services, the running pair untouched
	bash bench/services_startup.sh 3

bench-migrations: install services-up  # the migrations: Alembic against a hand-written runner
	$(BIN)/python bench/migrations.py --rounds 7 --inner 5

bench-http-choice: install services-up  # the agent's HTTP client, alternating
	$(BIN)/python bench/http_client_choice.py --rounds 2

bench-rows: install services-up  # bytes per row as stored, on a scratch database (capacity.md)
	$(BIN)/python bench/row_sizes.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache build postbacks/*.c postbacks/*.so

.PHONY: cluster-up cluster-down
cluster-up:  # a three-broker Kafka cluster beside the single broker (services.sh cluster)
	$(SERVICES) cluster up

cluster-down:
	$(SERVICES) cluster down

.PHONY: k8s-check
k8s-check: install  # deploy/k8s/ against the Kubernetes schemas, offline (also in tests/contract)
	$(BIN)/kubernetes-validate --strict --quiet $(filter-out deploy/k8s/kustomization.yaml,$(wildcard deploy/k8s/*.yaml))
