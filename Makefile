# Two entry points that do all the set-up on a fresh machine (Debian, root or sudo-less root):
#   make apply   apply and verify the DSpark patchset on its pinned vLLM
#   make test    the whole test suite, with the real Docker Engine, registry and arm64 emulation
#                (as root: .ci/test.sh starts the services under PK_SERVICES_ROOT, default
#                /tmp/patchkit-tests, on ports found free, and stops what it started at the end)
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=
# workers of pytest-xdist; the engine tests (*_docker.py) run in order on one of them
# (tests/conftest.py); JOBS=0 runs in this process
JOBS ?= 2

.PHONY: apply test venv clean

$(PY): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -e '.[test]'
	touch $(PY)

venv: $(PY)

apply: $(PY)
	$(VENV)/bin/patchkit validate
	$(VENV)/bin/patchkit apply
	$(VENV)/bin/patchkit verify --tree .patchkit/vllm

test: $(PY)
	bash .ci/test.sh $(PY) -m pytest -n $(JOBS) $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .patchkit
