# Two entry points for a new user:
#   make simulate   - run `hami simulate` on its bundled example (creates .venv on first use)
#   make test       - run every test (installs Python deps, builds native/, installs the
#                     Kubernetes binaries into the cache; the first run takes a while)
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: simulate test unit native kube node bench clean proto gpu-check

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $(STAMP)

simulate: $(STAMP)
	$(BIN)/hami simulate

native:
	$(MAKE) -C native

# gRPC stubs of the kubelet device plugin API (generated, git-ignored)
PROTO_STUB := src/hami/deviceplugin/api/api_pb2.py
$(PROTO_STUB): src/hami/deviceplugin/api/api.proto $(STAMP)
	$(BIN)/python -c 'from hami.deviceplugin.api import generate; generate(force=True)'

proto: $(PROTO_STUB)

kube:
	scripts/install-kube.sh

# containerd, runc, CNI plugins, iptables (Debian packages) for the real node of the tests
node:
	scripts/install-node.sh

test: $(STAMP) proto native kube node
	$(BIN)/python -m pytest -q -ra tests

unit: $(STAMP) proto
	$(BIN)/python -m pytest -q tests/unit

bench: $(STAMP) native
	for b in bench/*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

# Real-GPU checks (device plugin on real NVML, libvgpu limits under PyTorch, compute shares);
# each prints SKIP on a machine without an NVIDIA GPU.
gpu-check: $(STAMP) native proto
	scripts/gpu-check.sh

clean:
	rm -rf $(VENV) native/build .pytest_cache .hypothesis
