# Membrane. `make demo` runs the agent and a short demo on the fake
# datapath; `make test` runs every test (root tests too, when root).
GO      ?= go
BIN     := bin
PREFIX  ?= /usr/local
DESTDIR ?=
CMDS    := membrane-agent membrane-cni membranectl membrane-sim
# Tests share 2 cores with the build; -p 2 keeps root tests from starving.
TESTFLAGS ?= -race -count=1 -p 2 -timeout 20m

.PHONY: all build test test-short fuzz bench demo vet clean

all: build

build:
	@mkdir -p $(BIN)
	$(GO) build -trimpath -o $(BIN)/ $(addprefix ./cmd/,$(CMDS))

vet:
	$(GO) vet ./...

test: build vet
	$(GO) test $(TESTFLAGS) ./...

test-short:
	$(GO) test -short -count=1 ./...

# Each fuzz target for FUZZTIME (go test -fuzz runs one target at a time).
FUZZTIME ?= 20s
fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzParse$$' -fuzztime $(FUZZTIME) ./pkg/labels/
	$(GO) test -run '^$$' -fuzz '^FuzzParseSet$$' -fuzztime $(FUZZTIME) ./pkg/labels/
	$(GO) test -run '^$$' -fuzz '^FuzzRange$$' -fuzztime $(FUZZTIME) ./pkg/ipam/
	$(GO) test -run '^$$' -fuzz '^FuzzParseRef$$' -fuzztime $(FUZZTIME) ./pkg/endpoint/
	$(GO) test -run '^$$' -fuzz '^FuzzEndpointChangeRequest$$' -fuzztime $(FUZZTIME) ./pkg/api/

# Benchmarks recorded in BENCHMARKS.md.
bench:
	$(GO) test -run '^$$' -bench . -benchtime 200000x ./pkg/ipam/
	$(GO) test -run '^$$' -bench . -benchtime 2s ./pkg/api/

demo: build
	./scripts/demo.sh

clean:
	rm -rf $(BIN)
