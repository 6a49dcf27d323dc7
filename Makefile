# Two commands on a fresh machine: `make demo` and `make test`. Both bootstrap first.
SHELL := /bin/bash
PY := .venv/bin/python
OPA := .triloop/bin/opa

.PHONY: bootstrap demo test lint policy-test unit integration bench up down status

bootstrap:
	@scripts/bootstrap.sh

demo: bootstrap
	@$(PY) -m scripts.demo

lint: bootstrap
	@echo "== ruff"; .venv/bin/ruff check triloop execution_loop learning_loop governance_loop web tests bench scripts migrations
	@echo "== mypy (strict)"; .venv/bin/mypy triloop execution_loop learning_loop governance_loop web
	@echo "== import-linter"; .venv/bin/lint-imports --no-cache

policy-test: bootstrap
	@echo "== opa check/fmt/test"; $(OPA) check --strict policies/ && $(OPA) fmt --list --fail policies/ && $(OPA) test policies/ --timeout 120s --coverage --threshold 95 --format json >/dev/null && $(OPA) test policies/ --timeout 120s

test: lint policy-test
	@TRILOOP_WITH_BROWSER=1 scripts/bootstrap.sh
	@echo "== pytest"; $(PY) -m pytest

unit: bootstrap
	@$(PY) -m pytest tests/unit

bench: bootstrap
	@"$$(cat .venv/.triloop-deps)/bin/python" -m pip install --quiet "trl>=0.12"
	@$(PY) bench/run_all.py

up: bootstrap
	@.venv/bin/triloop dev up

down:
	@.venv/bin/triloop dev down

status:
	@.venv/bin/triloop dev status
