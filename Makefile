# toolbatch: developer and CI entry points. `make help` is not a target;
# read the comment above each one.

# Recipes run in bash with errexit, nounset and pipefail, so a failing
# command inside a pipe or a multi-line recipe fails the target.
SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c

GO ?= go
# ARGS are passed to the engine by `make run`, e.g. make run ARGS='--nats-url nats://host:4222'.
ARGS ?=
# FUZZTIME is how long `make fuzz` runs each Fuzz target.
FUZZTIME ?= 30s

# GOFMT_CHECK fails when gofmt would change any file (or cannot parse one)
# and lists the offending files on stderr.
define GOFMT_CHECK
unformatted="$$(gofmt -l .)"; \
if [ -n "$$unformatted" ]; then \
	echo "gofmt: these files need formatting (run gofmt -w):" >&2; \
	echo "$$unformatted" >&2; \
	exit 1; \
fi
endef

.PHONY: build test run bench bench-observed bench-peers lint fuzz chaos chaos-cluster sandbox-deps browser-deps ts-deps ts-test mcp-deps

# build: compile every package and program.
build:
	$(GO) build ./...

# test: vet, check formatting, then run all tests with the race detector
# (the race detector needs cgo, so a C compiler such as gcc must be installed),
# then the TypeScript client's tests against a real engine (ts-test).
test: sandbox-deps browser-deps ts-deps mcp-deps
	$(GO) vet ./...
	@$(GOFMT_CHECK)
	CGO_ENABLED=1 $(GO) test -race -count=1 -timeout 15m ./...
	$(MAKE) --no-print-directory ts-test

# ts-deps: the TypeScript client's packages (package-lock.json), installed
# with npm when node_modules is missing.
ts-deps:
	@cd clients/typescript && if [ ! -d node_modules ]; then npm ci --no-audit --no-fund; fi

# mcp-deps: the MCP servers from npm that the sandbox tests run in
# bubblewrap (testdata/mcp/package-lock.json), installed when missing.
mcp-deps:
	@cd testdata/mcp && if [ ! -d node_modules ]; then npm ci --no-audit --no-fund; fi

# ts-test: the TypeScript client's tests (node --test), each against an
# engine built from this repository with go.
ts-test: ts-deps
	cd clients/typescript && PATH="$$(dirname "$$(command -v $(GO))"):$$PATH" node --test test/*.test.js

# bench-peers: DBOS Transact for Go on PostgreSQL (a cluster started in a
# temporary directory) with W1's and W2's shapes, then toolbatch's W1 and W2
# in the same run, alternating for PEERS_ROUNDS rounds, then each round's
# ratios and their medians (docs/performance.md). bench/peers is a
# module of its own: the project's go.mod does not depend on DBOS.
PEERS_OUT ?= bench/peers/results
PEERS_ROUNDS ?= 3
bench-peers:
	@if ! command -v pg_ctl >/dev/null 2>&1 && ! ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql; \
		else \
			echo "bench-peers needs PostgreSQL: install the postgresql package" >&2; exit 1; \
		fi; \
	fi
	@mkdir -p $(PEERS_OUT) && rm -f $(PEERS_OUT)/dbos-*.json $(PEERS_OUT)/toolbatch-*.json
	for i in $$(seq $(PEERS_ROUNDS)); do \
		(cd bench/peers && $(GO) run . --reps 1 --out $(abspath $(PEERS_OUT))/dbos-$$i.json) && \
		$(GO) run ./bench --go "$(GO)" --reps 1 --modes default --skip census,ceiling,parked,w3,w4,mcp,failover --out $(PEERS_OUT)/toolbatch-$$i.json \
		|| exit 1; \
	done
	cd bench/peers && $(GO) run . --compare --dir $(abspath $(PEERS_OUT))

# run: run the engine (embedded NATS unless ARGS say otherwise).
# The engine is built first and exec'd, so that the signals make gets
# (Ctrl-C, kill -TERM) reach it: go run would leave its child running.
run:
	@mkdir -p .bin
	$(GO) build -o .bin/engine ./cmd/engine
	exec .bin/engine $(ARGS)

# bench: the benchmark program (docs/performance.md); writes bench/results.json.
bench:
	$(GO) run ./bench --go "$(GO)" --out bench/results.json

# bench-observed: what metrics and traces cost (issue 17): the default mode
# and the observed mode side by side, in OBSERVED_ROUNDS interleaved rounds
# (each round two fresh clusters): W1 measured on one then the other (which
# starts first and which is measured first alternate), W2 on both at once;
# each round's ratios, their medians and their balanced geometric means
# (docs/performance.md, "Interleaved rounds").
OBSERVED_ROUNDS ?= 16
bench-observed:
	$(GO) run ./bench --go "$(GO)" --interleave $(OBSERVED_ROUNDS) --w2-together --modes default,observed \
		--w1 3s --w2 5s --w2-warmup 2s --skip ceiling,census,parked,w3,w4,w5,mcp,failover --out bench/observed.json

# lint: gofmt must list nothing, and go vet must pass.
lint:
	@$(GOFMT_CHECK)
	$(GO) vet ./...

# fuzz: run each Fuzz target in ./events for FUZZTIME (go test -fuzz takes
# one target at a time, so the targets are listed first).
fuzz:
	@listing="$$($(GO) test -list '^Fuzz' ./events)"; \
	targets="$$(printf '%s\n' "$$listing" | grep '^Fuzz' || true)"; \
	if [ -z "$$targets" ]; then \
		echo "fuzz: no Fuzz targets found in ./events" >&2; \
		exit 1; \
	fi; \
	for t in $$targets; do \
		echo "fuzz: $$t for $(FUZZTIME)"; \
		$(GO) test -run '^$$' -fuzz "^$$t\$$" -fuzztime "$(FUZZTIME)" ./events; \
	done

# chaos: long crash schedules (kill -9 of engines, workers and nats-server)
# over seeded workloads, checked by the audit; CHAOS_SCHEDULES, CHAOS_SEED.
chaos:
	CHAOS_SCHEDULES="$${CHAOS_SCHEDULES:-20}" $(GO) test -count=1 -timeout 60m -v -tags chaos -run '^TestChaos$$' ./chaos

# chaos-cluster: long fault schedules on a 3-node nats-server cluster (kill -9
# of a follower, of the events stream's leader and of the meta leader,
# SIGSTOP past an election, rolling restarts; even seeds only these, odd
# seeds also kill engines), checked by the audit and, for server-only
# plans, for no indeterminate call, no doubled replay_safe effect and no
# unavailable_before_dispatch; prints failover figures; CHAOS_SCHEDULES
# (default 6), CHAOS_SEED.
chaos-cluster:
	CHAOS_SCHEDULES="$${CHAOS_SCHEDULES:-6}" $(GO) test -count=1 -timeout 60m -v -tags chaos -run '^TestChaosCluster$$' ./chaos

# sandbox-deps: the sandbox tests run real bubblewrap sandboxes; install
# bubblewrap (Debian's package) when it is missing and we are root.
# debian_dep: when command $(1) is missing, install Debian's package $(2)
# with apt-get if this is root, else say what to install; $(3) says which
# tests need it.
define debian_dep
	@if ! command -v $(1) >/dev/null 2>&1; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
			echo "installing $(2) for $(3)"; \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(2); \
		else \
			echo "$(3) need $(2): install the $(2) package (e.g. sudo apt-get install $(2))" >&2; \
			exit 1; \
		fi; \
	fi
endef

# browser-deps: Debian's Chromium, which the console's tests drive.
browser-deps:
	$(call debian_dep,chromium,chromium,the console's browser tests)

sandbox-deps:
	$(call debian_dep,bwrap,bubblewrap,the sandbox tests)
