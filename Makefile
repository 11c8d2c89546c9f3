# Two commands for a fresh machine: `make run` and `make test`. Both set up on first use.
.PHONY: setup run test test-fast lint bench

setup:
	@bash scripts/setup.sh

run: setup
	@.venv/bin/kvscope $(ARGS)

lint: setup
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/mypy
	.venv/bin/lint-imports

# Three workers, on two cores too: the engine tests in one (they share one engine, one
# server, one fleet), everything else in the other two. Many tests wait on a clock (a mock
# server's set TTFT and ITL, a timeout, a server starting), and a third worker computes
# meanwhile: 10:24-11:20 against 11:07-12:35 with two (docs/testing.md).
# PYTEST_WORKERS=0 runs it all in this process.
PYTEST_WORKERS ?= 3

test: lint
	.venv/bin/pytest -q -n $(PYTEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

# Everything but the tests that start vLLM: the UI, the fake engine, the roofline.
test-fast: lint
	.venv/bin/pytest -q -m "not engine" $(PYTEST_ARGS)

bench: setup
	.venv/bin/python benchmarks/ui_lag.py
	.venv/bin/python benchmarks/prefill_vs_decode.py
