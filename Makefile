# The fast loop. The README's test command (e2e/test.sh) is still what CI runs: vet, gofmt, unit
# and end-to-end tests against a real broker it starts, then every fuzz target.
#
#   make test    unit tests only, no broker (every package but e2e/; under a minute)
#   make e2e     e2e/test.sh: everything, against a real Apache Pulsar broker
#   make fuzz    every fuzz target for FUZZTIME (default 30s) each
#   make lint    gofmt, go vet, staticcheck, shellcheck
#   make deadcode  functions neither the binaries nor the tests reach (none, last checked)

# ./... is the product module only (go.work: the end-to-end module, e2e/, is ./e2e/...).
UNIT = ./...
FUZZTIME ?= 30s

.PHONY: test e2e fuzz lint deadcode

test:
	go test $(UNIT)

e2e:
	e2e/test.sh

fuzz:
	FUZZTIME=$(FUZZTIME) e2e/fuzz.sh

lint:
	@test -z "$$(gofmt -l $$(git ls-files '*.go' | grep -v '\.pb\.go$$'))" || { gofmt -l $$(git ls-files '*.go' | grep -v '\.pb\.go$$'); echo "gofmt would change the files above"; exit 1; }
	go vet ./... ./e2e/...
	@command -v staticcheck >/dev/null || { echo "staticcheck: go install honnef.co/go/tools/cmd/staticcheck@v0.8.1"; exit 1; }
	staticcheck ./... ./e2e/...
	@command -v shellcheck >/dev/null || { echo "shellcheck: apt-get install shellcheck"; exit 1; }
	shellcheck $$(git ls-files '*.sh') .ci/run

deadcode:
	@command -v deadcode >/dev/null || { echo "deadcode: go install golang.org/x/tools/cmd/deadcode@v0.44.0"; exit 1; }
	@out=$$(deadcode -test ./... ./e2e/...); test -z "$$out" || { echo "$$out"; exit 1; }
