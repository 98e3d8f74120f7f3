# agenthost — build, test, lint and benchmark.
#
#   make build   compile every package and the agenthost binary into bin/
#   make test    lint, warm the test cache, then every test (race-enabled), fuzz seed corpora included
#   make warm-cache  build the conformance plugins and fill the wazero cache, without -race
#   make lint    gofmt -l and go vet; fails on any finding
#   make bench   the go test benchmarks (figures in docs/BENCHMARKS.md)

GO       ?= go
BIN      := bin
# One on-disk cache (compiled test plugins, wazero compilation cache) shared
# by every test process, so -race runs never compile Wasm from scratch.
export AGENTHOST_TEST_CACHE ?= $(CURDIR)/.cache/test
TESTFLAGS ?=

.PHONY: build test lint bench clean warm-cache

build:
	$(GO) build ./...
	$(GO) build -o $(BIN)/agenthost ./cmd/agenthost

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...

# Compiling Wasm under -race is about 11x slower (DESIGN §9): build the
# conformance plugins and compile them into the shared on-disk wazero cache
# once, without -race, so the race-enabled tests only read the cache.
warm-cache:
	$(GO) test -count=1 -run '^TestWarmPluginCache$$' ./host/
	$(GO) test -count=1 -run '^TestWarmExampleCache$$' ./examples/plugins/

test: lint warm-cache
	$(GO) test -race -count=1 -timeout 20m $(TESTFLAGS) ./...
	# At full scale without -race: 10,000 pending effects add no goroutines.
	$(GO) test -count=1 -run '^TestTenThousandPendingEffectsAddNoGoroutines$$' ./runtime

bench:
	$(GO) test -run '^$$' -bench . -benchmem $(TESTFLAGS) ./...

clean:
	rm -rf $(BIN) .cache
