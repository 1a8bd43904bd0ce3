# Two entry points for a new user:
#   make simulate   - run `hami simulate` on its bundled example (creates .venv on first use)
#   make test       - run every test (installs Python deps, builds native/, installs the
#                     Kubernetes binaries into the cache and, as root, the real node's Debian
#                     packages; the first run takes a while)
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: ui-assets simulate test check docs-images unit native kube koord node browser bench fuzz clean proto gpu-check image push image-offline images image-tools

$(STAMP): pyproject.toml devkit/pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q -e '.[test]' -e ./devkit
	touch $(STAMP)

simulate: $(STAMP)
	$(BIN)/hami simulate

native:
	$(MAKE) -C native

# gRPC stubs of the kubelet device plugin API (generated, git-ignored)
PROTO_STUB := src/hami/deviceplugin/api/api_pb2.py
$(PROTO_STUB): src/hami/deviceplugin/api/api.proto $(STAMP)
	$(BIN)/python -c 'from hami.deviceplugin.api import generate; generate(force=True)'

# gRPC stubs of the kubelet DRA plugin and plugin registration APIs (generated, git-ignored)
DRA_STUB := src/hami/draplugin/api/dra_pb2.py
$(DRA_STUB): src/hami/draplugin/api/dra.proto src/hami/draplugin/api/registration.proto src/hami/draplugin/api/dra_health.proto $(STAMP)
	$(BIN)/python -c 'from hami.draplugin.api import generate; generate(force=True)'

# protobuf messages of the NRI plugin API and its ttrpc envelope (generated, git-ignored)
NRI_STUB := src/hami/node/nri/nri_pb2.py
$(NRI_STUB): src/hami/node/nri/nri.proto src/hami/node/nri/ttrpc.proto $(STAMP)
	$(BIN)/python -c 'from hami.node.nri import generate; generate(force=True)'

proto: $(PROTO_STUB) $(DRA_STUB) $(NRI_STUB)

kube:
	scripts/install-kube.sh

# Koordinator (koord-scheduler, koordlet, koord-manager) from its Go module at a pinned version,
# for the Koordinator integration (docs/integrations.md, tests/realnode/test_koordinator.py);
# cached: a second run takes about a second
koord:
	scripts/install-koord.sh

# containerd, runc, CNI plugins, iptables (Debian packages) for the real node of the tests
node:
	scripts/install-node.sh

# uPlot for the web UI's history charts: npm registry, pinned version and integrity hash, copied into
# src/hami/ui/static/ (git-ignored) so the wheel and the image serve it (scripts/install-ui-assets.sh)
ui-assets:
	scripts/install-ui-assets.sh

# Debian's chromium for the web UI's browser tests (driven by Playwright, pinned in the test extras)
browser:
	scripts/install-browser.sh

# --- images (see docs/install.md "Building the image" and docs/testing.md "Offline images") ---
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
IMAGE   ?= ghcr.io/hami-py/hami:$(VERSION)
# docker when its daemon answers, else podman, else buildah (all read Containerfile + .dockerignore)
BUILDER ?= $(shell if docker info >/dev/null 2>&1; then echo docker; \
	elif command -v podman >/dev/null; then echo podman; elif command -v buildah >/dev/null; then echo buildah; fi)

# The product image from the Containerfile, with a registry (`IMAGE=registry/name:tag make image push`)
image: ui-assets
	@test -n "$(BUILDER)" || { echo "make image: no docker daemon, podman or buildah here (offline: make image-offline)" >&2; exit 1; }
	$(BUILDER) build -f Containerfile --build-arg VERSION=$(VERSION) $(if $(BASE),--build-arg BASE=$(BASE)) \
		--build-arg REVISION=$$(git rev-parse HEAD 2>/dev/null || echo unknown) -t $(IMAGE) .

push:
	@test -n "$(BUILDER)" || { echo "make push: no docker daemon, podman or buildah here" >&2; exit 1; }
	$(BUILDER) push $(IMAGE)

# The same Containerfile without a registry or daemon: Debian base + buildah -> OCI archive (root)
image-offline: ui-assets
	scripts/build-image.sh

IMAGE_TOOLS := buildah debootstrap busybox-static
image-tools:
	@if [ "$$(id -u)" = 0 ] && ! dpkg -s $(IMAGE_TOOLS) >/dev/null 2>&1; then \
		export DEBIAN_FRONTEND=noninteractive; APT="apt-get -y -q -o DPkg::Lock::Timeout=600"; \
		$$APT install $(IMAGE_TOOLS) || { $$APT update && $$APT install $(IMAGE_TOOLS); }; fi

# Every image the tests and the real node use (pause, busybox, kube-scheduler, hami), cached in
# <cache>/images; what this machine cannot build is reported as skipped
images: $(STAMP) kube image-tools
	$(BIN)/python -m hami_devkit.images

# Lint and format (ruff), the layering of docs/development.md (import-linter: contracts in
# pyproject.toml), and types of the pure model (mypy: core/, dra/). A broken rule names file and line.
check: $(STAMP)
	$(BIN)/ruff check src tests bench devkit
	$(BIN)/ruff format --check src tests bench devkit
	$(BIN)/lint-imports
	$(BIN)/mypy

test: $(STAMP) check proto native kube koord node browser ui-assets images
	$(BIN)/python -m pytest -q -ra tests

# The web UI's screenshots in docs/images/, from the browser tests (make test writes them to a temporary directory)
docs-images: $(STAMP) proto kube browser ui-assets
	HAMI_DOCS_IMAGES=1 $(BIN)/python -m pytest -q tests/integration/test_ui_browser.py

unit: $(STAMP) proto ui-assets
	$(BIN)/python -m pytest -q tests/unit

bench: $(STAMP) native ui-assets
	for b in $(filter-out bench/fuzz_inputs.py,$(wildcard bench/*.py)); do echo "== $$b"; $(BIN)/python $$b || exit 1; done

# Every input surface (quantities, registrations, webhook, /filter /bind /webhook, hami simulate, the UI
# read API, DRA gRPC prepare/unprepare and CDI files, DRA translation, claim/slice watches, checkpoints)
# fuzzed with about 130,000 generated inputs; prints inputs / crashes / HTTP 500s / wrong verdicts.
fuzz: $(STAMP) proto
	$(BIN)/python bench/fuzz_inputs.py

# Every claim on a real NVIDIA GPU, one table (device plugin on real NVML, PyTorch under a 3000 MiB
# limit, nvidia-smi, compute shares, libvgpu overhead); installs PyTorch into its own venv; prints
# SKIP (exit 0) without a GPU, before building anything. See scripts/gpu-check.sh.
gpu-check:
	scripts/gpu-check.sh

clean:
	rm -rf $(VENV) native/build .pytest_cache .hypothesis
