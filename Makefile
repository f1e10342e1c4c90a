# iop — common tasks. `make test` is the one command that runs every test.
GO ?= go
BIN := $(CURDIR)/bin
PROTOC_GEN_GO_VERSION := v1.36.12
PROTOC_GEN_GO_GRPC_VERSION := v1.5.1
# The Ollama release the real-server tests run against (internal/ollamatest.Version).
OLLAMA_VERSION := v0.17.4
# The helm the chart's tests render deploy/helm/iop with (make helm).
HELM_VERSION := v4.3.2
HELM := $(HOME)/.cache/iop/helm-$(HELM_VERSION)/helm

.PHONY: all build run test chromium postgresql etcd systemd helm ollama proto bench bench-peers chaos clean

all: build

# The version, commit and build date iop version prints (and a node reports
# to the edge): git describe, else the Go toolchain's own record.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo 0.1.0-dev)
COMMIT ?= $(shell git rev-parse HEAD 2>/dev/null)
DATE ?= $(shell date -u +%Y-%m-%dT%H:%M:%SZ)
LDFLAGS := -X main.version=$(VERSION) -X main.commit=$(COMMIT) -X main.date=$(DATE)

# CGO off, as the Dockerfile builds it: a static binary (SQLite is
# modernc.org/sqlite, pure Go), and each iop process maps no libc (about
# 1.8 MiB less resident memory; BENCHMARKS.md).
build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o $(BIN)/iop ./cmd/iop

# Runs the main job: an edge with an in-process node (local Ollama if present, else the simulator).
# Pass flags with ARGS, e.g. make run ARGS="--listen 127.0.0.1:9090 --sim".
run:
	$(GO) run ./cmd/iop dev $(ARGS)

# Runs every test with the race detector. First installs what the tests
# need beyond Go: the JavaScript client tests' npm packages (test/js),
# Chromium for the dashboard's browser test, PostgreSQL (the usage
# ledger's test starts a throwaway server), helm (the chart's tests) and a
# real Ollama server (built from source once per machine, see the ollama
# target), each only when missing. The chart's tests are a Go module of
# their own (deploy/helm/check), vetted here and run by package deploy. IOP_TEST_STRICT=1 makes a test whose tool is missing fail instead
# of skip (package internal/testenv), so make test skips nothing;
# IOP_OLLAMA_BIN tells the real-Ollama tests where the binary is.
# The end-to-end suite (internal/e2e, the longest package) runs as its own
# go test beside the one of every other package, so it starts at once and
# has its own number of parallel tests, E2E_PARALLEL: most of its tests
# spend their time waiting on processes, timeouts and streams. Its harness
# hands those slots out itself (harness.Parallel): one real-Ollama test at
# a time, those first, then the longest tests, so none starts last; and
# while the machine has idle cores it adds slots, up to twice
# E2E_PARALLEL (once the other packages end, six tests alone left half a
# core idle: most of a short test's time is waiting). TEST_P
# programs (builds, links, test binaries) of the other packages run at
# once, TEST_PARALLEL parallel tests in each. Make test on a clean clone,
# warm, on 2 cores: 8 m 50 s with one go test at -p 2 -parallel 4; 6 m 24 s
# at -p 4 -parallel 4; 7 m 14 s at -p 4 -parallel 8 (more tests at once
# spent more CPU than they saved); 6 m 9 s with the suite apart at
# -parallel 6 and the rest at -p 3 -parallel 4; 5 m 5 s with the linked
# test binaries kept (TESTBIN). The storm tests (which count the process's
# goroutines, so run alone before the parallel e2e tests, ~50 s) were tried
# in a go test of their own beside the suite: 4 m 56 s – 5 m 31 s, but
# beside the parallel tests their burst outlasted the queue timeout.
# -trimpath keeps the build cache's entries independent of the checkout's
# directory, so a clean clone elsewhere reuses them (without it a new clone
# compiled every iop package again: 100 CPU-seconds). GORACE's
# atexit_sleep_ms=0 ends each race-detector test binary at once instead of
# a second later: 54 binaries, 54 seconds of a slot. A race during the tests
# is reported where it happens, as before; what the sleep adds is a second
# in which goroutines left running after the last test may still race.
# The race detector also turns on checkptr (the checks of unsafe pointer
# conversions) in every package; make test keeps it for iop's own packages
# and turns it off for the standard library and the dependencies (SQLite's
# transpiled C above all), whose conversions are theirs to check: 7 % less
# CPU (585 against 629 CPU-seconds, 5 m 42 s against 5 m 52 s).
# go test links every test binary again on every run (2 CPU-seconds a
# package with -race, 90 in all); with -o it keeps the linked binary in
# TESTBIN and skips the link while the package and its dependencies are
# unchanged (the file's build ID says so). -s -w leaves out the symbol
# table and DWARF, as go test does for a binary it does not keep; stack
# traces and race reports do not use them. Packages whose directories end
# in the same name (internal/batch, internal/edge/api/batch) cannot share
# one -o directory: the second of each name goes in a second go test.
# Two make tests of different code at once on one machine need TESTBINs of
# their own (each would run the other's binaries).
E2E_PARALLEL ?= 6
TEST_P ?= 3
TEST_PARALLEL ?= 4
TESTBIN ?= $(HOME)/.cache/iop/test-binaries
RACE_TEST = $(GO) test -race -count=1 -ldflags='-s -w' -timeout 30m
test: export GOFLAGS := -trimpath -gcflags=all=-d=checkptr=0 -gcflags=iop/...=-d=checkptr=1 $(GOFLAGS)
test: export GORACE := atexit_sleep_ms=0 $(GORACE)
test: test/js/node_modules chromium postgresql etcd systemd helm ollama
	$(GO) vet ./...
	cd deploy/helm/check && $(GO) vet ./...
	export IOP_OLLAMA_BIN="$$(OLLAMA_VERSION=$(OLLAMA_VERSION) GO=$(GO) test/ollama/build.sh)" IOP_HELM_BIN=$(HELM) IOP_TEST_STRICT=1; \
	$(RACE_TEST) -o $(TESTBIN)/e2e/ -parallel $(E2E_PARALLEL) ./internal/e2e/ & e2e=$$!; \
	pkgs="$$($(GO) list ./... | grep -v '/internal/e2e$$')"; \
	first="$$(echo "$$pkgs" | awk -F/ '!seen[$$NF]++')"; again="$$(echo "$$pkgs" | awk -F/ 'seen[$$NF]++')"; \
	$(RACE_TEST) -o $(TESTBIN)/1/ -p $(TEST_P) -parallel $(TEST_PARALLEL) $$first; rest=$$?; \
	[ -z "$$again" ] || $(RACE_TEST) -o $(TESTBIN)/2/ -p $(TEST_P) -parallel $(TEST_PARALLEL) $$again || rest=1; \
	wait $$e2e && exit $$rest

# The npm packages of the JavaScript client tests (the official `openai` and `ollama`
# clients), exactly as package-lock.json pins them. Needs Node.js and npm.
# They are installed once per package.json and lock file in
# JS_MODULES/<their hash> (outside the tree: a clean clone does not install
# them again, 14 s) and test/js/node_modules links there.
JS_MODULES ?= $(HOME)/.cache/iop/js-modules
test/js/node_modules: test/js/package.json test/js/package-lock.json
	@command -v npm >/dev/null || { echo "npm (Node.js 20 or later) is needed for the JavaScript client tests" >&2; exit 1; }
	@dir="$(JS_MODULES)/$$(cat test/js/package.json test/js/package-lock.json | sha256sum | cut -c1-16)"; \
	if [ ! -d "$$dir/node_modules" ]; then \
		mkdir -p "$(JS_MODULES)" && tmp="$$(mktemp -d "$(JS_MODULES)/tmp.XXXXXX")" && \
		cp test/js/package.json test/js/package-lock.json "$$tmp/" && \
		(cd "$$tmp" && npm ci --silent --no-audit --no-fund) && \
		{ mv -T "$$tmp" "$$dir" 2>/dev/null || rm -rf "$$tmp"; } || exit 1; \
	fi; \
	rm -rf test/js/node_modules && ln -s "$$dir/node_modules" test/js/node_modules && touch "$$dir/node_modules"

# A CPU-only Ollama server for the real-server tests (internal/ollamatest):
# test/ollama/build.sh builds it with `go install github.com/ollama/ollama@$(OLLAMA_VERSION)`
# into ~/.cache/iop/ollama-$(OLLAMA_VERSION)/ (several minutes, once per
# machine; it installs Debian's nlohmann-json3-dev and libstb-dev first).
# Does nothing when the binary is there; a failed build fails make test.
ollama:
	@OLLAMA_VERSION=$(OLLAMA_VERSION) GO=$(GO) test/ollama/build.sh >/dev/null

# Installs Debian's chromium (headless browser of the dashboard test) unless present.
chromium:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }

# Debian's etcd-server package (3.4.x), for the cluster tests' real
# three-member etcd (internal/testenv/etcdtest runs `etcd` from PATH, or
# IOP_ETCD_BIN). Quiet; does nothing when the binary is there.
etcd:
	@command -v etcd >/dev/null 2>&1 || [ -n "$$IOP_ETCD_BIN" ] || { \
		echo "installing etcd (Debian's etcd-server package) for the cluster tests" >&2; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq etcd-server >/dev/null; }

# Debian's systemd package, for systemd-analyze verify of the units in
# deploy/systemd (package deploy's test). Quiet; does nothing when the
# command is there.
systemd:
	@command -v systemd-analyze >/dev/null 2>&1 || { \
		echo "installing systemd-analyze (Debian's systemd package) for the unit files' test" >&2; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq systemd >/dev/null; }

# helm $(HELM_VERSION), built from the Go module proxy into ~/.cache/iop
# once per machine (7.5 CPU-minutes: about 4 minutes on 2 idle cores), for the chart's tests
# (helm lint, helm template). Does nothing when the binary is there.
helm:
	@[ -x $(HELM) ] || { \
		echo "installing helm $(HELM_VERSION) (go install helm.sh/helm/v4/cmd/helm) for the chart's tests" >&2; \
		GOBIN=$(dir $(HELM)) $(GO) install helm.sh/helm/v4/cmd/helm@$(HELM_VERSION); }

# Debian's postgresql package, for the usage ledger's PostgreSQL test (which
# runs initdb and postgres from /usr/lib/postgresql/*/bin itself). Quiet; does
# nothing when the binaries are there.
postgresql:
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || { \
		echo "installing PostgreSQL (Debian's postgresql package) for the ledger test" >&2; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null; }

# Benchmarks (not part of make test): the scheduler's and the hot paths'
# (go test -bench, output kept in bin/bench-go.txt), then the overhead
# benchmark: iop sim, edge and node as separate processes, the same load
# directly and through edge + node, and the edge's memory with 10,000
# queued requests; it prints every figure with its target, the
# scheduler's (waiter bytes, AdmitRelease) read from bin/bench-go.txt.
# The packages run one at a time (-p 1): two benchmarks sharing the 2
# cores would each measure the other. Figures: BENCHMARKS.md.
bench: build
	$(GO) test -p 1 -run '^$$' -bench . -benchmem ./internal/scheduler/ ./internal/edge/api/ ./internal/wire/nodev1/ ./internal/node/adapter/ >$(BIN)/bench-go.txt; \
		rc=$$?; cat $(BIN)/bench-go.txt; exit $$rc
	$(BIN)/iop bench --overhead --profile-dir $(BIN)/bench-profiles --go-bench $(BIN)/bench-go.txt $(BENCH_ARGS)

# The side-by-side table of issue 35 (not part of make test; about 20
# minutes with the defaults): iop (edge + node as separate processes, on
# the tunnel and the normalized path), Olla and Bifrost in front of one
# zero-latency iop sim, non-streamed at 1 and 32 clients, streamed at 8,
# a 100 KB request at 8, three alternating rounds of 15 s; it prints the
# means, iop's ratio to the best peer and the load average. It fetches
# nothing: test/peers/build.sh builds each peer from its snapshot at the
# pinned commit under ~/.cache/iop/peers/<name>-<commit>/ (its header says
# how to put a snapshot there) and a missing peer is left out. Shorter:
# make bench-peers PEERS_ARGS="--rounds 1 -d 5s". Figures: BENCHMARKS.md; the profiles
# of its iop processes per workload: test/peers/profile.sh.
OLLA_COMMIT := 200c24f6f2758da6f45411fbd61a89c14a4ec239
BIFROST_COMMIT := 5978108db0fd9a50a3349d10bb6aa311502c05e2
bench-peers: build
	$(BIN)/iop bench --peers $$(OLLA_COMMIT=$(OLLA_COMMIT) BIFROST_COMMIT=$(BIFROST_COMMIT) GO=$(GO) test/peers/build.sh) $(PEERS_ARGS)

# The chaos suite (not part of make test; about 30 minutes): per run a
# fresh three-member etcd, three edges with `cluster:` on one PostgreSQL,
# two nodes and three iop sims, 36 streaming clients, and one fault:
# SIGKILL or SIGSTOP of the leader, lost etcd quorum, a follower's stalled
# link to the leader, a restarted follower or node, another deployment on
# the same etcd (package internal/chaos). Checks the invariants after
# every run and writes the table of worst figures to bin/chaos-table.md.
# One scenario: make chaos SCENARIO=kill RUNS=5 (SCENARIO takes a
# comma-separated list; RUNS defaults to 5).
SCENARIO ?=
RUNS ?= 5
chaos: build etcd postgresql
	IOP_CHAOS=1 IOP_CHAOS_BIN=$(BIN)/iop IOP_CHAOS_SCENARIO=$(SCENARIO) IOP_CHAOS_RUNS=$(RUNS) IOP_TEST_STRICT=1 \
		$(GO) test -race -count=1 -timeout 120m -v -run '^(TestProxyModes|TestChaos)$$' ./internal/chaos/ >$(BIN)/chaos.log 2>&1; \
		rc=$$?; grep -E '^ *(--- |chaos_test.go|\||Chaos suite|Scenarios:|ok|FAIL|PASS)' $(BIN)/chaos.log; exit $$rc

# Regenerates the protocol's Go code with pinned plugin versions (protoc from Debian's protobuf-compiler).
proto:
	@command -v protoc >/dev/null || (apt-get update -qq && apt-get install -y -qq protobuf-compiler)
	GOBIN=$(BIN) $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)
	GOBIN=$(BIN) $(GO) install google.golang.org/grpc/cmd/protoc-gen-go-grpc@$(PROTOC_GEN_GO_GRPC_VERSION)
	PATH=$(BIN):$$PATH protoc -I internal/wire \
		--go_out=internal/wire --go_opt=paths=source_relative \
		--go-grpc_out=internal/wire --go-grpc_opt=paths=source_relative \
		internal/wire/node.proto internal/wire/cluster.proto
	mkdir -p internal/wire/nodev1 internal/wire/clusterv1
	mv internal/wire/node.pb.go internal/wire/node_grpc.pb.go internal/wire/nodev1/
	mv internal/wire/cluster.pb.go internal/wire/cluster_grpc.pb.go internal/wire/clusterv1/

clean:
	rm -rf $(BIN)
