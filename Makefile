# Developer shortcuts. The tests: bash .ci/run (or .venv/bin/python -m pytest -q).

PYTHON ?= .venv/bin/python

.PHONY: bench bench-quick

# All five benchmarks of issue 8 (gputop against nvitop and the /proc floor); about 4 minutes.
bench:
	$(PYTHON) -m benchmarks --out benchmarks/latest.md

bench-quick:
	$(PYTHON) -m benchmarks --quick
