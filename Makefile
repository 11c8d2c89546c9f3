# Two commands for a fresh machine: `make run` and `make test`. Both set up on first use.
.PHONY: setup run test lint bench fresh-check

setup:
	@bash scripts/setup.sh

run: setup
	@.venv/bin/kvscope $(ARGS)

test: setup
	.venv/bin/ruff check .
	.venv/bin/mypy
	.venv/bin/pytest -q $(PYTEST_ARGS)

bench: setup
	.venv/bin/python benchmarks/ui_lag.py
	.venv/bin/python benchmarks/sweep.py
