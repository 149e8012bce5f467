# taskrunner — the two commands a newcomer needs are `make run` and `make test`.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
GO ?= go
DEV := .dev
BIN := $(DEV)/bin
PKGS := ./proto/... ./platform/... ./services/... ./gateway/... ./runner/... ./tools/... ./tools/bench/...
BINARIES := ./services/cmd/taskrunnerd ./gateway/cmd/gateway ./tools/cmd/taskctl ./tools/cmd/forge \
            ./tools/cmd/modelapi ./tools/cmd/devstack ./runner/cmd/runner

.PHONY: help run test build proto lint npm jaeger chromium agent-access check-go check-node clean

help:
	@echo "make run    - bring the whole stack up locally (Ctrl-C stops it)"
	@echo "make test   - install what is needed, then run every test of every module"
	@echo "make proto  - lint the protos and regenerate Go, gateway and OpenAPI code"
	@echo "make build  - build all binaries into $(BIN)/"

check-go:
	@command -v $(GO) >/dev/null || { echo "Go is required (https://go.dev/dl); none found on PATH" >&2; exit 1; }

check-node:
	@command -v npm >/dev/null || { echo "Node.js and npm are required for the agent CLIs: apt-get install nodejs npm" >&2; exit 1; }

# The agent CLIs (Claude Code, Codex, OpenSpec), pinned in package-lock.json.
npm: node_modules/.installed
node_modules/.installed: package.json package-lock.json | check-node
	npm ci --no-audit --no-fund --loglevel=error
	@touch $@

build: check-go
	@mkdir -p $(BIN)
	$(GO) build -o $(BIN)/ $(BINARIES)

# Jaeger is pinned as a Go tool in its own module (tools/jaeger/go.mod). The
# first build takes about 6 minutes on 2 cores; the binary stays in $(BIN)
# and is rebuilt only when the pin changes.
jaeger: $(BIN)/jaeger
$(BIN)/jaeger: tools/jaeger/go.mod tools/jaeger/go.sum | check-go
	@mkdir -p $(BIN)
	@echo "building Jaeger v1.76.0 (first time: about 6 minutes)…"
	cd tools/jaeger && GOWORK=off $(GO) build -o $(abspath $(BIN))/jaeger github.com/jaegertracing/jaeger/cmd/jaeger

# The agent CLIs run as an unprivileged user (Claude Code refuses
# bypassPermissions as root), so that user must be able to reach
# node_modules: a checkout under /root (mode 0700) is not.
agent-access: npm
	@if [ "$$(id -u)" = 0 ] && ! runuser -u nobody -- test -x "$(CURDIR)/node_modules/.bin/claude" 2>/dev/null; then \
	  echo "letting the unprivileged agent user reach $(CURDIR) (chmod o+x on its parent directories)"; \
	  d="$(CURDIR)"; while [ "$$d" != / ]; do chmod o+x "$$d"; d=$$(dirname "$$d"); done; fi

run: build npm jaeger agent-access bubblewrap
	$(BIN)/devstack up --dev-dir $(DEV) --bin-dir $(BIN)

# Tests need PostgreSQL and Redis: `devstack deps` finds them or starts
# throwaway ones under .dev/, and TASKRUNNER_REQUIRE_SERVICES makes any test
# that cannot reach them fail instead of skip.
# The console's browser tests drive Debian's Chromium through playwright-core.
chromium:
	@test -x /usr/bin/chromium || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing Debian's chromium for the browser tests…"; \
	    (apt-get install -y --no-install-recommends chromium >/dev/null 2>&1 || \
	     (apt-get update >/dev/null && apt-get install -y --no-install-recommends chromium >/dev/null)); \
	  else echo "Chromium is required for the browser tests: apt-get install chromium" >&2; exit 1; fi; }

# The process sandbox provider runs every task in bubblewrap and refuses to
# start without it (TASKRUNNER_PROCESS_UNISOLATED=1 is the escape hatch).
.PHONY: bubblewrap
bubblewrap:
	@test -x /usr/bin/bwrap || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing Debian's bubblewrap for the process sandbox provider…"; \
	    (apt-get install -y --no-install-recommends bubblewrap >/dev/null 2>&1 || \
	     (apt-get update >/dev/null && apt-get install -y --no-install-recommends bubblewrap >/dev/null)); \
	  else echo "bubblewrap is required by the process sandbox provider: apt-get install bubblewrap (or set TASKRUNNER_PROCESS_UNISOLATED=1)" >&2; exit 1; fi; }

test: check-go npm build jaeger chromium agent-access bubblewrap
	$(BIN)/devstack deps --dev-dir $(DEV) > $(DEV)/test.env
	source $(DEV)/test.env && TASKRUNNER_REQUIRE_SERVICES=1 TASKRUNNER_REQUIRE_AGENTS=1 TASKRUNNER_BIN_DIR=$(abspath $(BIN)) \
	  $(GO) test -count=1 -timeout 30m $(PKGS)
	# Every fuzz target, briefly, beyond its seed corpus (module boundaries,
	# GOWORK=off builds and tidiness are checked by tools/modcheck, in PKGS).
	@for t in $(FUZZ_TARGETS); do pkg=$${t%%:*}; fn=$${t##*:}; \
	  echo "fuzz $$fn ($$pkg, $(FUZZTIME))"; \
	  $(GO) test -run '^$$' -fuzz "^$$fn\$$" -fuzztime $(FUZZTIME) $$pkg || exit 1; done

# package:FuzzTarget for every fuzz target. make test runs each for a count
# of inputs, not a duration: with a duration, Go 1.26's fuzz coordinator can
# report "context deadline exceeded" as a failure when the time runs out
# under load (golang/go#75804, fixed in Go 1.27), which a count cannot hit.
# `make fuzz FUZZTIME=5m` runs each for longer (a duration: the same race is
# possible at its end; a real finding always writes testdata/fuzz/…).
FUZZTIME ?= 10000x
FUZZ_TARGETS := ./platform/redact/:FuzzRedact ./platform/redact/:FuzzClean ./platform/redact/:FuzzTruncate \
  ./platform/eventwire/:FuzzMessageRoundTrip ./platform/eventwire/:FuzzDecodeMessage ./platform/eventwire/:FuzzDecodeEvent \
  ./platform/eventwire/:FuzzFastJSON ./platform/eventwire/:FuzzEncodeMessageBody \
  ./gateway/sse/:FuzzAppendFrame ./gateway/sse/:FuzzParseLastEventID ./gateway/httperr/:FuzzTruncate \
  ./runner/eventsclient/:FuzzSplitLines ./runner/eventsclient/:FuzzFitEvent \
  ./services/task/:FuzzCursor ./services/events/:FuzzPageToken

.PHONY: fuzz
fuzz: check-go
	@for t in $(FUZZ_TARGETS); do pkg=$${t%%:*}; fn=$${t##*:}; \
	  echo "fuzz $$fn ($$pkg, $(FUZZTIME))"; \
	  $(GO) test -run '^$$' -fuzz "^$$fn\$$" -fuzztime $(FUZZTIME) $$pkg || exit 1; done

lint: check-go
	$(GO) tool buf lint
	$(GO) vet $(PKGS)

proto: check-go
	$(GO) tool buf lint
	rm -rf proto/gen
	$(GO) tool buf generate

clean:
	rm -rf $(BIN)

# The event path benchmark (issue 3): the runner protocol against the HMAC
# callbacks it replaces, in one process on the PostgreSQL and Redis that
# `devstack deps` finds or starts. Extra flags: make bench-events BENCH_FLAGS='-rtt 0,26ms'.
.PHONY: bench-events
bench-events: check-go
	@mkdir -p $(DEV)
	$(GO) build -o $(BIN)/devstack ./tools/cmd/devstack
	$(GO) build -o $(BIN)/bench-events ./tools/bench/cmd/bench-events
	$(BIN)/devstack deps --dev-dir $(DEV) > $(DEV)/bench.env
	source $(DEV)/bench.env && $(BIN)/bench-events $(BENCH_FLAGS)

# The committers sweep (issue 17): bench-events' new design with 1, 2 and 4
# group committers, on 1 core and on every core, each time with a PostgreSQL
# and a Redis of its own pinned to the same cores (tools/bench/committers.sh),
# about 8 minutes on 2 cores. BENCH_CPUSETS='0 0-3' and
# BENCH_COMMITTERS=1,2,4,8 choose what it measures.
.PHONY: bench-committers
bench-committers: check-go
	@mkdir -p $(DEV)
	$(GO) build -o $(BIN)/bench-events ./tools/bench/cmd/bench-events
	BENCH_BIN=$(BIN)/bench-events BENCH_FLAGS='$(BENCH_FLAGS)' tools/bench/committers.sh

# The SSE fan-out benchmark (issue 17): the gateway's SSE hub against Mercure
# (embedded, in tools/bench's own module), about 5 minutes on 2 cores; it
# raises its open-file limit itself. Smaller runs: make bench-sse BENCH_FLAGS='-idle 1000 -subs 100'.
.PHONY: bench-sse
bench-sse: check-go
	@mkdir -p $(DEV)
	$(GO) build -o $(BIN)/devstack ./tools/cmd/devstack
	$(GO) build -o $(BIN)/bench-sse ./tools/bench/cmd/bench-sse
	$(BIN)/devstack deps --dev-dir $(DEV) > $(DEV)/bench.env
	source $(DEV)/bench.env && $(BIN)/bench-sse $(BENCH_FLAGS)

# The fault suite (issue 19): real taskrunnerd against its own throwaway
# PostgreSQL and Redis (never the shared ones), killing or stopping one
# thing at a time while runners stream. Not part of `make test`: about
# 90-110 s on 2 cores. Needs the PostgreSQL server binaries and redis-server.
.PHONY: test-faults
test-faults: build
	TASKRUNNER_FAULTS=1 TASKRUNNER_BIN_DIR=$(abspath $(BIN)) $(GO) test -count=1 -v -timeout 20m ./tools/faults/
