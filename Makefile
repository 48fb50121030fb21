# relaybus: the two commands at the top of the README are `make dev` and `make test`.
GO ?= go
TESTENV = $(GO) run ./internal/cmd/testenv --

.PHONY: dev demo load test test-short bench bench-compare bench-harness fuzz lint golangci-lint fmt build screenshots tf-fmt terraform

## dev: run the whole stack on this machine until Ctrl-C (DEV_FLAGS: the
## command's flags, e.g. DEV_FLAGS="-addr 127.0.0.1:9090 -state /tmp/s").
## make dev TRANSPORT=nats runs it on NATS JetStream (embedded, or NATS_URL's)
## instead of Pub/Sub; make demo then runs against it (make passes both on).
DEV_FLAGS ?=
dev:
	@command -v $(GO) >/dev/null 2>&1 || { echo "make dev: Go not found: install Go 1.26 or newer (https://go.dev/dl/)"; exit 1; }
	$(GO) run ./internal/cmd/dev $(DEV_FLAGS)

## demo: run the purchase scenario against the running stack.
demo:
	@command -v $(GO) >/dev/null 2>&1 || { echo "make demo: Go not found: install Go 1.26 or newer (https://go.dev/dl/)"; exit 1; }
	$(GO) run ./internal/cmd/demo

## load: drive the running stack (make dev) open loop and report; RATE, DURATION, DRAIN, MEMBERS override.
RATE ?= 200
DURATION ?= 60s
DRAIN ?= 60s
MEMBERS ?= 100
load:
	@command -v $(GO) >/dev/null 2>&1 || { echo "make load: Go not found: install Go 1.26 or newer (https://go.dev/dl/)"; exit 1; }
	$(GO) run ./internal/cmd/load -rate $(RATE) -duration $(DURATION) -drain $(DRAIN) -members $(MEMBERS)

## test: the linter, then the whole suite with the race detector against a
## throwaway Postgres and the Google emulators. Packages run one at a time
## (-p 1): the crash and outage tests time how fast the stack recovers, and
## other packages' tests on the same cores would be timed with them.
## Those load tests of the local stack (UNRACED) skip themselves under the
## race detector, which slows the stack several times, and run again after
## it, without.
## Then the suites of the hot paths again, through PgBouncer in transaction
## mode (pgx's exec query mode), as behind Supabase's pooler (docs/postgres.md).
UNRACED = ^(TestCrashRecovery|TestFirestoreOutageSlowsTheRecordNotTheEvents|TestStackKeepsToItsConnectionBudget)$$
test: lint
	$(TESTENV) $(GO) test -race -count=1 -p 1 -timeout 60m ./...
	$(TESTENV) $(GO) test -count=1 -timeout 30m -run '$(UNRACED)' ./internal/devstack
	$(TESTENV) env RELAYBUS_TEST_VIA_PGBOUNCER=1 $(GO) test -race -count=1 -p 1 -short -timeout 20m $(POOLED_PKGS)

POOLED_PKGS = ./shared/outbox ./shared/relay ./functions/publish ./functions/consume

## test-short: the suite without the slow concurrency and crash tests.
test-short:
	$(TESTENV) $(GO) test -count=1 -short ./...

## screenshots: the console's browser tests, saving their screenshots to docs/console for docs/operations.md and docs/catalog.md,
## and the telemetry's pictures (a purchase's trace, the dashboard over a local run) to docs/telemetry.
screenshots:
	RELAYBUS_SCREENSHOTS=$(CURDIR)/docs/console $(TESTENV) $(GO) test -count=1 -run '^(TestConsoleInABrowser|TestCatalogInABrowser|TestConsoleControlsABackfill|TestConsoleAddsChangesAndRemovesAForwarder)$$' ./functions/dlqreplay/
	RELAYBUS_SCREENSHOTS=$(CURDIR)/docs/telemetry $(TESTENV) $(GO) test -count=1 -run '^TestTelemetryPictures$$' ./internal/devstack/

## bench: every benchmark; prints BENCH <name> <value> <unit> lines (and every
## failure), keeps the whole output in .bench.out, and fails when a benchmark fails.
bench:
	@bash -o pipefail -c "$(GO) run ./internal/cmd/testenv -durable -- $(GO) test -p 1 -run '^\$$' -bench . -benchtime 1x -timeout 60m ./... 2>&1 | tee .bench.out | grep --line-buffered -E '^(BENCH|#|--- FAIL|FAIL|panic:)|_test.go:[0-9]+:'"

## bench-compare: BENCHES (<package>=<benchmark regexp> ...) of the commit
## BASE and of the working tree, interleaved (base, head, ...) for ROUNDS
## rounds on one durable Postgres and one set of emulators; prints each
## figure's median per side, the ratio head/base and the rounds' spread.
## make bench-compare BASE=06225b8
BASE ?=
ROUNDS ?= 3
BENCHES ?= './shared/relay=^BenchmarkDrain$$' './functions/consume=^BenchmarkConsume$$'
bench-compare:
	@test -n "$(BASE)" || { echo "make bench-compare: name the base commit: make bench-compare BASE=<commit>"; exit 2; }
	$(GO) run ./internal/cmd/testenv -durable -- $(GO) run ./internal/cmd/benchcompare -base $(BASE) -rounds $(ROUNDS) $(BENCHES)

## bench-harness: relaybus (bench/pgqb/relaybus) and River in the public
## Postgres-queue harness, 200 jobs/s offered to 16 workers, on one throwaway
## cluster; installs Debian's Python packages it needs and prints
## BENCH harness_claim_p99_ms_<system> and harness_jobs_per_s_<system>.
## The harness's git directory must be fetched first (PGQB_GIT; see bench/pgqb/run.sh).
bench-harness:
	bash bench/pgqb/run.sh

## fuzz: every fuzz target in the tree (found in the source, not listed
## here) for FUZZTIME each; the corpus is in each package's testdata/fuzz.
FUZZTIME ?= 60s
fuzz:
	$(GO) run ./internal/cmd/fuzz -fuzztime $(FUZZTIME)

## lint: gofmt, go vet and golangci-lint with the checked-in .golangci.yml
## (golangci-lint v2.15.0, installed into $GOPATH/bin when missing).
GOLANGCI_LINT_VERSION = 2.15.0
GOLANGCI_LINT ?= $(shell $(GO) env GOPATH)/bin/golangci-lint
lint: golangci-lint
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); if [ -n "$$out" ]; then echo "not gofmt'ed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GOLANGCI_LINT) run ./...

golangci-lint:
	@"$(GOLANGCI_LINT)" version 2>/dev/null | grep -q "version $(GOLANGCI_LINT_VERSION) " || $(GO) install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@v$(GOLANGCI_LINT_VERSION)

fmt:
	gofmt -w $$(git ls-files '*.go')

## build: every function and command as a static linux/amd64 binary in bin/.
build:
	@mkdir -p bin
	@for f in publish relay consume rollup dlqreplay; do \
		CGO_ENABLED=0 GOOS=linux GOARCH=amd64 $(GO) build -trimpath -o bin/$$f ./functions/$$f/cmd || exit 1; done

## tf-fmt: terraform fmt -check on infra/terraform (a terraform on PATH, else Terraform 1.5.7 built into $GOPATH/bin once, ~4 min).
TERRAFORM ?= $(shell command -v terraform 2>/dev/null || echo "$$($(GO) env GOPATH)/bin/terraform")
tf-fmt: terraform
	TF_CLI_CONFIG_FILE=/dev/null "$(TERRAFORM)" fmt -check -recursive -diff infra/terraform

## terraform: Terraform 1.5.7 built into $GOPATH/bin unless one is on PATH (the
## infra tests run it: fmt, console, validate without providers).
terraform:
	@test -x "$(TERRAFORM)" || $(GO) install github.com/hashicorp/terraform@v1.5.7
