# abox build, test and demo entry points. Every target installs what it needs.
GO       ?= go
SHELL    := /bin/bash
BIN      := bin/abox
PKGS     := ./...
FUZZTIME ?= 10s

.PHONY: all build test unit vet fuzz e2e bench bench-boot bench-clients demo demo-dns clean deps

all: build

build:
	$(GO) build -trimpath -o $(BIN) ./cmd/abox

# deps installs the Debian packages the VM layer and its tests need (idempotent).
deps:
	@if [ "$$(id -u)" = 0 ]; then sh scripts/host-deps.sh; else echo "make deps: not root, skipping package install" >&2; fi

vet:
	@test -z "$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))" || { echo "gofmt needed:"; gofmt -l .; exit 1; }
	$(GO) vet $(PKGS)

unit:
	$(GO) test -race -count=1 $(PKGS)

# fuzz gives every fuzz target a short run; the corpora in testdata/fuzz run in `unit` too.
fuzz:
	@sh scripts/fuzz.sh $(FUZZTIME)

# e2e boots real guests under libvirt (TCG) inside a network namespace of its
# own; the harness's standalone boot test is left out (TestVM covers it).
E2E_PKGS := ./e2e/... ./internal/libvirt/ ./internal/hostfw/ ./internal/image/
e2e: deps
	$(GO) test -p 1 -tags e2e -count=1 -timeout 75m -v -skip 'TestBootDebian12' $(E2E_PKGS) 2>&1 | tee e2e.log | grep -E '^(=== RUN|--- |\s+--- |PASS|FAIL|ok|panic)|FIGURE'; exit $${PIPESTATUS[0]}

test: deps vet unit fuzz e2e

bench: build
	@sh scripts/bench.sh
	@if [ "$$(id -u)" = 0 ]; then $(MAKE) --no-print-directory bench-boot; else echo "make bench: not root, skipping the boot benchmark (make bench-boot)" >&2; fi

# bench-boot: first boot of a new instance in the offline lab (root, TCG):
# start→SSH, start→ready and the guest's own phases. ROUNDS=N for more.
bench-boot: deps
	$(GO) run ./tools/benchboot -rounds $${ROUNDS:-1}

# bench-clients: go mod download and npm install, direct and through
# `abox http serve` (needs the network; see scripts/bench-realclient.sh).
bench-clients: build
	@sh scripts/bench-realclient.sh

# demo: the main job. Builds the base image (once), starts an instance in an
# offline lab network and shows what the guest can and cannot reach.
demo: deps build
	$(GO) run ./tools/demo

# demo-dns: the DNS filter alone on loopback (no VM, a few seconds).
demo-dns: build
	@sh scripts/demo.sh

clean:
	rm -rf bin
