# The two commands of the README:
#   make demo  - install everything, run a GPU job on a real Slurm sandbox, tear down
#   make test  - install everything, run the whole test suite
VENV ?= /opt/slurm-gpu/venv
PY := $(VENV)/bin/python

.PHONY: install demo test unit integration bench clean deb test-deb rpm gpu-check-bundle

install:
	SLURM_GPU_VENV=$(VENV) bash scripts/install.sh

demo: install
	SLURM_GPU_VENV=$(VENV) bash scripts/demo.sh

test: install
	SLURM_GPU_VENV=$(VENV) bash scripts/test.sh

integration:
	SLURM_GPU_VENV=$(VENV) bash scripts/test.sh -m integration

unit:
	$(PY) -m pytest -q tests/unit

bench:
	$(PY) bench/run_all.py

# Packages (docs/install.md): a .deb for Debian 12/13, an .rpm for EL8/9, each built
# from a throw-away build venv (python3 -m venv): no `make install` needed.
deb:
	bash scripts/build-deb.sh

test-deb:
	bash scripts/test-deb.sh

rpm:
	bash scripts/build-rpm.sh

# One directory to carry to a GPU machine (docs/development.md): wheels for
# CPython 3.10-3.13 on x86_64 and aarch64, tests/gpu, and gpu-check.sh.
gpu-check-bundle:
	bash scripts/gpu-check-bundle.sh

clean:
	rm -rf build dist *.egg-info .pytest_cache devkit/build devkit/*.egg-info
