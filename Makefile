# abox build, test and demo entry points. Every target installs what it needs.
GO       ?= go
BIN      := bin/abox
PKGS     := ./...
FUZZTIME ?= 10s

.PHONY: all build test unit vet fuzz bench demo clean deps

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

test: deps vet unit fuzz

bench: build
	@sh scripts/bench.sh

demo: build
	@sh scripts/demo.sh

clean:
	rm -rf bin
