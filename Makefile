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

# Two workers: the engine tests in one (they share one engine, one server, one fleet),
# everything else in the other. A third was tried (10:00-11:20 against 10:47-12:35 on a
# 2-core EPYC, docs/testing.md) and left out: at its load (4.9 on two cores) the ITL
# agreement with vLLM's own stamps failed twice in five runs. PYTEST_WORKERS=0 runs it
# all in this process.
PYTEST_WORKERS ?= 2

test: lint
	.venv/bin/pytest -q -n $(PYTEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

# Everything but the tests that start vLLM: the UI, the fake engine, the roofline.
test-fast: lint
	.venv/bin/pytest -q -m "not engine" $(PYTEST_ARGS)

bench: setup
	.venv/bin/python benchmarks/ui_lag.py
	.venv/bin/python benchmarks/prefill_vs_decode.py
