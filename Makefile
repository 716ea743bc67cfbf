# cann-train: two commands.  `make run` serves the app with a demo;  `make test` runs the tests (CI adds the long tier).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PORT   ?= 8000
# make test: processes the test files are spread over (pytest-xdist; each starts its own Redis, database and stack)
TEST_WORKERS ?= 2
HOST   ?= 127.0.0.1
export PORT HOST
# keep torch-npu (if ever installed) from breaking `import torch` on machines without the Ascend runtime
export TORCH_DEVICE_BACKEND_AUTOLOAD ?= 0
# the venv's tools first: torch.utils.cpp_extension looks for the ninja wheel's `ninja` on PATH
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: setup run test test-long lint native chromium pdf-libs slurm clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,test]'
	@touch $@

native: setup
	@if [ -f native_ops/__main__.py ]; then $(PY) -m native_ops build; fi

run: setup native pdf-libs
	$(PY) -m controlplane.stack --host $(HOST) --port $(PORT)

# WeasyPrint (the energy reports' PDF) needs Pango and a font
pdf-libs:
	@if ! ldconfig -p | grep -q libpangoft2-1.0.so.0; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing Pango and a font for the report PDFs"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libpango-1.0-0 libpangoft2-1.0-0 fonts-dejavu-core >/dev/null; \
	  else echo "Pango missing and not root: energy reports cannot be rendered (apt install libpangoft2-1.0-0)"; fi; \
	fi

chromium:
	@if [ ! -x /usr/bin/chromium ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing Debian's chromium for the browser tests"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	  else echo "chromium missing and not root: browser tests will be skipped"; fi; \
	fi

# a real one-node Slurm for tests/integration/test_external_launchers.py (Debian's 22.05 packages; the test
# writes its own slurm.conf and munge key and starts the daemons itself)
slurm:
	@if [ ! -x /usr/sbin/slurmctld ] || [ ! -x /usr/sbin/slurmd ] || [ ! -x /usr/bin/sbatch ] || [ ! -x /usr/sbin/munged ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing Debian's Slurm (slurmctld, slurmd, slurm-client) and munge for the Slurm launcher tests"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurmctld slurmd slurm-client munge >/dev/null; \
	  else echo "Slurm missing and not root: the Slurm launcher tests will be skipped"; fi; \
	fi

# make test: the developer's loop, every test but the long tier; make test-long: the long tier (tests marked
# `long`: the costliest fault and layout scenarios); CI (.ci/run) runs lint and both. Each tier writes a JUnit
# report and prints its slowest tests and files.
test: setup native chromium pdf-libs slurm
	@mkdir -p var/test
	@$(PY) -m pytest -q --durations=40 -n $(TEST_WORKERS) --dist loadfile -m "not long" --junitxml=var/test/junit.xml; \
	  rc=$$?; $(PY) tests/slowest_files.py var/test/junit.xml 20; exit $$rc

test-long: setup native chromium pdf-libs slurm
	@mkdir -p var/test
	@$(PY) -m pytest -q --durations=20 -n $(TEST_WORKERS) --dist loadfile -m long --junitxml=var/test/junit-long.xml; \
	  rc=$$?; $(PY) tests/slowest_files.py var/test/junit-long.xml 20; exit $$rc

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports

clean:
	rm -rf var/test var/static .pytest_cache
