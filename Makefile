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

# torch is optional: the tests that compare against it are skipped without it, and the demo's
# network (a torchvision-style ResNet-18 exported to ONNX) needs it. It is installed apart from
# the extras because only this exact version lies on the build machine.
$(VENV)/.torch-tried: $(STAMP)
	-$(PY) -m pip install --quiet torch==2.13.0
	touch $@

demo: $(STAMP) $(VENV)/.torch-tried
	$(VENV)/bin/asymo info
	$(VENV)/bin/asymo emulate --core 1 --speed 0.5 -- $(VENV)/bin/asymo info
	$(VENV)/bin/asymo demo
	$(VENV)/bin/asymo emulate --core 1 --speed 0.5 -- $(VENV)/bin/asymo demo
	$(VENV)/bin/asymo plan resnet50

# The NEON kernels are built with the aarch64 cross compiler and run under qemu-aarch64 in the
# tests: install both from the distribution when they are missing (as root, with apt-get).
ARM_TOOLS := $(VENV)/.arm-tools-tried
$(ARM_TOOLS): $(STAMP)
	@if command -v aarch64-linux-gnu-gcc >/dev/null && command -v qemu-aarch64 >/dev/null; then :; \
	elif command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	    gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user >/dev/null; \
	else echo "NOTE: no aarch64-linux-gnu-gcc / qemu-aarch64 and no root apt-get: the NEON tests will be skipped"; fi
	touch $@

test: $(STAMP) $(VENV)/.torch-tried $(ARM_TOOLS)
	$(PY) -m pytest -q

# In-place build for development with the system Python (no virtualenv).
build:
	$(PYTHON) csrc/build_native.py

clean:
	rm -rf $(VENV) build *.egg-info asymo/_native*.so asymo/lab/_native*.so \
		asymo/_matmul_fast*.so asymo/_native.c asymo/lab/_native.c asymo/*.o
	find csrc -name '*.o' -delete
