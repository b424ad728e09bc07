# Two commands on a fresh machine:  `make demo`  and  `make test`.
# Both create a virtualenv in .venv and install asymo into it (editable) first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.asymo-installed

.PHONY: demo test build install clean

# every C file and header under csrc/ (any depth) and the build scripts
CSRC_FILES := $(shell find csrc -name '*.[ch]' -o -name '*.py')

$(STAMP): pyproject.toml setup.py $(CSRC_FILES)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,bench]'
	touch $(STAMP)

install: $(STAMP)

# torch is optional: the tests that compare against it are skipped when it is absent.
$(VENV)/.torch-tried: $(STAMP)
	-$(PY) -m pip install --quiet torch==2.13.0
	touch $@

demo: $(STAMP)
	$(VENV)/bin/asymo info
	$(VENV)/bin/asymo emulate --core 1 --speed 0.5 -- $(VENV)/bin/asymo info
	$(VENV)/bin/asymo demo
	$(VENV)/bin/asymo emulate --core 1 --speed 0.5 -- $(VENV)/bin/asymo demo
	$(VENV)/bin/asymo plan resnet50

test: $(STAMP) $(VENV)/.torch-tried
	$(PY) -m pytest -q

# In-place build for development with the system Python (no virtualenv).
build:
	$(PYTHON) csrc/build_native.py

clean:
	rm -rf $(VENV) build *.egg-info asymo/_native*.so asymo/_lab*.so asymo/_matmul_fast*.so \
		asymo/_native.c asymo/_lab.c asymo/*.o
	find csrc -name '*.o' -delete
