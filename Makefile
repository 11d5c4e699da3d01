# Everything a developer or CI runs. `make test` and `make demo` work on a fresh
# machine with Python >= 3.11 and Go: they create .venv, install the locked
# dependencies, and build the control plane (cached outside the repo).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml requirements/lock.txt | cksum | cut -d' ' -f1)
CONTROLPLANE := tests/e2e/controlplane/build.sh
NODE := tests/e2e/controlplane/build-node.sh

.PHONY: test demo venv lint unit e2e controlplane node image lock podresources deviceplugin clean

test: lint controlplane node ## all tests: lint, types, unit, contract, e2e against the real control plane and a real node
	$(BIN)/pytest

demo: venv controlplane ## the seed 001 story, before and after Headroom, on a local control plane
	$(BIN)/headroom demo

venv: $(STAMP)

$(STAMP): pyproject.toml requirements/lock.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c requirements/lock.txt -e '.[test,demo]'
	@rm -f $(VENV)/.installed-* && touch $@

lint: venv ## ruff, ruff format, mypy --strict, import-linter
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

unit: venv ## everything but e2e (no control plane needed)
	$(BIN)/pytest -m "not e2e"

e2e: venv controlplane node
	$(BIN)/pytest -m e2e

controlplane: ## build kube-apiserver & co. from Go modules into ~/.cache/headroom (once)
	$(CONTROLPLANE)

node: ## kubelet, CNI plugins and the pause image for the real node (once); Debian's containerd and runc if missing
	$(NODE)

image: venv controlplane ## the Headroom and kube-scheduler images with buildah (no Docker), OCI archives in ~/.cache/headroom/images
	$(BIN)/python -m devcluster.images --check

lock: ## re-resolve requirements/lock.txt from pyproject.toml
	rm -rf .lock-venv && $(PYTHON) -m venv .lock-venv
	.lock-venv/bin/pip install --quiet '.[test,demo]'
	.lock-venv/bin/pip freeze --exclude gpu-headroom > requirements/lock.txt
	rm -rf .lock-venv

podresources: venv ## regenerate agent/podresources stubs from the vendored kubelet proto (a test checks them)
	$(BIN)/python -m grpc_tools.protoc -I . --python_out=. --pyi_out=. --grpc_python_out=. agent/podresources/api.proto

deviceplugin: venv ## regenerate devcluster/deviceplugin stubs from the vendored kubelet proto (a test checks them)
	$(BIN)/python -m grpc_tools.protoc -I . --python_out=. --pyi_out=. --grpc_python_out=. devcluster/deviceplugin/api.proto

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
