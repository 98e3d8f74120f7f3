# agenthost — build, test, lint and benchmark.
#
#   make build   compile every package and the agenthost binary into bin/
#   make check   the everyday loop: gofmt, go vet and go test -short ./... (no installs,
#                no PostgreSQL, no browser, no chaos, no C or AssemblyScript builds)
#   make test    deps, lint, warm the test cache, then every test (race-enabled, with the
#                runtime's invariant checks), fuzz seed corpora included: what CI runs
#   make deps    install what the tests need when it is missing (scripts/deps.sh)
#   make deps-c  the same for the C toolchain alone, which make run needs
#   make warm-cache  build the conformance plugins and fill the wazero cache, without -race
#   make lint    gofmt -l, go vet and go mod tidy -diff; fails on any finding
#   make bench   the go test benchmarks (figures in docs/BENCHMARKS.md)
#   make bench-peers agenthost against DBOS Transact on one throwaway PostgreSQL
#                (benchpeers/, a module of its own; downloads its dependencies the
#                first time; not part of make test)
#   make bench-peers-recovery  the same two on kill -9 with Runs on slow jobs in
#                flight, then the restart's time until every Run is terminal:
#                RECOVERYFLAGS=--runs 10000 (issue 39's figure), default
#                --runs 200 --job-seconds 5 --rounds 2
#   make plugins the Go example plugins, into build/plugins/NAME.wasm, and the
#                conformance plugins (agenthost bench loads some), into build/plugins/conformance/
#   make plugins-c  the C example plugins, every examples/plugins/*-c (needs clang,
#                lld and wasi-libc)
#   make plugins-as the AssemblyScript example plugin (needs node and npm; npm ci
#                fetches the compiler and Extism's AssemblyScript PDK the first time)
#   make run     the host and the example plugins (the C builds of those a demo Run
#                calls), then one Run on config.example.yaml

GO       ?= go
BIN      := bin
# One on-disk cache (compiled test plugins, wazero compilation cache) shared
# by every test process, so -race runs never compile Wasm from scratch.
export AGENTHOST_TEST_CACHE ?= $(CURDIR)/.cache/test
TESTFLAGS ?=
PLUGINS  := build/plugins
QUESTION ?= What is (2+3)*4?

.PHONY: build check fmt-check test deps deps-c lint bench bench-peers bench-peers-recovery clean warm-cache plugins plugins-c plugins-as run

build:
	$(GO) build ./...
	$(GO) build -o $(BIN)/agenthost ./cmd/agenthost

# What the tests need beyond Go (the C toolchain for the C example, node and
# npm for the AssemblyScript one, the console's browser test and redocly lint
# of the API's OpenAPI document, chromium for the browser test, postgresql for pgstore's): installed with apt-get as root on Debian/Ubuntu, else the exact command to run is
# printed and make stops. Instant when everything is there.
deps:
	@sh scripts/deps.sh

# The C toolchain alone (clang, lld, wasi-libc, libclang-rt-14-dev-wasm32),
# for the C builds of the example plugins that make run loads.
deps-c:
	@sh scripts/deps.sh c

lint: fmt-check
	$(GO) vet ./...
	@$(GO) mod tidy -diff >/dev/null || { echo "go mod tidy would change go.mod or go.sum: run go mod tidy and commit the result"; $(GO) mod tidy -diff; exit 1; }

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi

# Compiling Wasm under -race is about 11x slower (docs/DESIGN.md §9): build the
# conformance plugins and compile them into the shared on-disk wazero cache
# once, without -race, so the race-enabled tests only read the cache.
warm-cache:
	$(GO) test -count=1 -run '^TestWarmPluginCache$$' ./host/
	$(GO) test -count=1 -run '^TestWarmExampleCache$$' ./examples/plugins/

# Every example with Go sources, built the way docs/ABI.md tells plugin
# authors to, then every conformance plugin (internal/plugincatalog names
# the ones `agenthost bench` loads). No C toolchain needed.
plugins:
	@mkdir -p $(PLUGINS)
	@set -e; for d in examples/plugins/*/; do \
	  n=$$(basename $$d); \
	  ls $$d*.go >/dev/null 2>&1 || continue; \
	  echo "building $(PLUGINS)/$$n.wasm"; \
	  GOOS=wasip1 GOARCH=wasm $(GO) build -buildmode=c-shared -o $(PLUGINS)/$$n.wasm ./examples/plugins/$$n; \
	done
	@mkdir -p $(PLUGINS)/conformance
	@set -e; for d in conformance/plugins/*/; do \
	  n=$$(basename $$d); \
	  [ "$$n" != internal ] || continue; \
	  echo "building $(PLUGINS)/conformance/$$n.wasm"; \
	  GOOS=wasip1 GOARCH=wasm $(GO) build -buildmode=c-shared -o $(PLUGINS)/conformance/$$n.wasm ./conformance/plugins/$$n; \
	done

# The C examples, each examples/plugins/NAME-c built by its build.sh into
# build/plugins/NAME-c.wasm (clang, lld, wasi-libc and libclang-rt-14-dev-wasm32;
# make deps installs them). `make test` builds and verifies them through the
# example tests; `agenthost bench runs|recovery --guests c` loads them.
plugins-c:
	@mkdir -p $(PLUGINS)
	@set -e; for d in examples/plugins/*-c/; do \
	  n=$$(basename $$d); \
	  echo "building $(PLUGINS)/$$n.wasm"; \
	  sh $$d/build.sh $(PLUGINS)/$$n.wasm; \
	done

# The AssemblyScript example (node and npm; make deps installs them). Its
# build.sh runs npm ci from package-lock.json when node_modules is missing or
# stale. `make test` builds and verifies it through the example tests.
plugins-as:
	@mkdir -p $(PLUGINS)
	examples/plugins/calculator-as/build.sh $(PLUGINS)/calculator-as.wasm

# A first Run on the embedded defaults: builder, model, tool call, model,
# final answer, streamed. config.example.yaml loads the C builds of the
# prompt builder, the scripted model, the calculator and slow-job (several
# times cheaper a call than their Go twins, with the same replies), and
# the Go builds of the other examples.
run: deps-c plugins plugins-c
	$(GO) build -o $(BIN)/agenthost ./cmd/agenthost
	$(BIN)/agenthost run --config config.example.yaml "$(QUESTION)"

# The everyday tier, for a person changing a package: -short skips what
# needs PostgreSQL, a browser, clang or node, and the crash, cluster, chaos
# and hostile-client tests (conformance.SkipInShort says which), and it
# installs nothing. make test runs all of it.
check: fmt-check
	$(GO) vet ./...
	$(GO) test -short -count=1 -timeout 10m $(TESTFLAGS) ./...

# -tags invariants turns the runtime's bookkeeping checks into panics
# (runtime/internal/attempts/invariants_on.go).
test: deps lint warm-cache
	$(GO) test -race -tags invariants -count=1 -timeout 20m $(TESTFLAGS) ./...
	# At full scale without -race: 10,000 pending effects add no goroutines.
	$(GO) test -count=1 -run '^TestTenThousandPendingEffectsAddNoGoroutines$$' ./runtime

bench:
	$(GO) test -run '^$$' -bench . -benchmem $(TESTFLAGS) ./...

# The peer comparison (docs/BENCHMARKS.md, "agenthost and DBOS"): benchpeers is
# a module of its own, so that DBOS is never a dependency of agenthost, and go
# vet ./... and go test ./... here never build it. First its test on a tiny
# workload, then the comparison: PEERSFLAGS=--concurrency 16 --runs 600, say
# (--guests go: the Go builds of the Wasm plugins in place of the C ones).
# Its tests include the recovery comparison's, which runs bin/agenthost, and
# one on the C builds.
PEERSFLAGS ?= --runs 300 --rounds 3 --concurrency 1,16
bench-peers: plugins plugins-c build
	cd benchpeers && $(GO) vet ./... && $(GO) test -count=1 ./...
	cd benchpeers && $(GO) run . --plugins ../$(PLUGINS) --cache-dir ../.cache/wazero $(PEERSFLAGS)

# The recovery comparison (docs/BENCHMARKS.md, "Recovery after kill -9"):
# bin/agenthost bench recovery --store postgres against DBOS recovering its
# pending workflows at Launch, on one throwaway PostgreSQL, in alternating
# rounds: RECOVERYFLAGS=--runs 10000, say.
RECOVERYFLAGS ?= --runs 200 --job-seconds 5 --rounds 2
bench-peers-recovery: plugins plugins-c build
	cd benchpeers && $(GO) run . recovery --agenthost ../$(BIN)/agenthost --plugins ../$(PLUGINS) --cache-dir ../.cache/wazero $(RECOVERYFLAGS)

clean:
	rm -rf $(BIN) .cache build .agenthost
