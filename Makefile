# Developer shortcuts. The tests: bash .ci/run (or .venv/bin/python -m pytest -q).

PYTHON ?= .venv/bin/python
NEED_VENV = @test -x $(PYTHON) || { echo "make: $(PYTHON) not found; first: python3 -m venv .venv && .venv/bin/pip install -e '.[bench]'" >&2; exit 2; }

.PHONY: bench bench-quick

# Every benchmark at every size of issue 13 (16/128/1,024 holders, 200/10,000 host processes, 120x40 and
# 200x60), gputop against nvitop and the /proc floor; about 30 minutes. Needs the bench extra (nvitop),
# tmux and a C compiler; a missing one is named in one line.
bench:
	$(NEED_VENV)
	$(PYTHON) -m benchmarks --out benchmarks/latest.md

# 16 and 1,024 holders, 200 host processes, 120x40, short windows: about 3 minutes.
bench-quick:
	$(NEED_VENV)
	$(PYTHON) -m benchmarks --quick
