# The two commands of the README:
#   make demo  - install everything, run a GPU job on a real Slurm sandbox, tear down
#   make test  - install everything, run the whole test suite
VENV ?= /opt/slurm-gpu/venv
PY := $(VENV)/bin/python

.PHONY: install demo test unit bench clean

install:
	bash scripts/install.sh

demo: install
	bash scripts/demo.sh

test: install
	bash scripts/test.sh

unit:
	$(PY) -m pytest -q tests/unit

bench:
	for b in bench/bench_*.py; do $(PY) $$b || exit 1; done

clean:
	rm -rf build *.egg-info .pytest_cache
