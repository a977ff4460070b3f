#!/usr/bin/env bash
# test.sh: the project's whole test suite, against a real Apache Pulsar broker it starts itself.
#
#   e2e/test.sh                 vet, unit and end-to-end tests, then every fuzz target briefly
#
# Settings (environment):
#   FUZZTIME             how long each fuzz target runs [5s]; 0 skips the fuzz pass
#   GO_TEST_FLAGS        extra flags for go test (e.g. -run Smoke -v)
#   TEST_BROKER_PORT / TEST_WEB_PORT   ports of the shared test broker [16750 / 18180]
#
# One broker (instance "test") serves every test package through PULSAR_SERVICE_URL and
# PULSAR_ADMIN_URL; tests that need another configuration start a private one themselves.
# The broker is stopped and its data wiped on exit, pass or fail.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

die() { echo "test.sh: $*" >&2; exit 2; }
for tool in go java mvn python3 curl haproxy; do
  command -v "$tool" >/dev/null 2>&1 || die "missing prerequisite: '$tool' is not on PATH"
done

echo "== go vet"
# Two modules (go.work): the product at the root, the end-to-end tests in e2e/.
go vet ./... ./e2e/...
# shellcheck disable=SC2046 # one argument per file
unformatted=$(gofmt -l $(git ls-files '*.go' | grep -v '\.pb\.go$') 2>/dev/null || true)
[ -z "$unformatted" ] || die "gofmt would change: $unformatted"

# helm, for e2e/helm (the chart's lint, render and manifest check): pinned, from the Go module
# proxy, built once per machine into $(go env GOPATH)/bin.
PATH="$(go env GOPATH)/bin:$PATH"
export PATH
if ! command -v helm >/dev/null 2>&1; then
  echo "== helm v3.22.0 (built once per machine, a few minutes)"
  (cd /tmp && timeout 900 go install helm.sh/helm/v3/cmd/helm@v3.22.0)
fi

if [ -x e2e/drivers/setup.sh ]; then
  echo "== client drivers (Go, Java, Python, Rust)"
  e2e/drivers/setup.sh
fi

export PULSAR_INSTANCE=test
export PULSAR_BROKER_PORT=${TEST_BROKER_PORT:-16750}
export PULSAR_WEB_PORT=${TEST_WEB_PORT:-18180}
trap 'e2e/pulsar/pulsar.sh stop || true' EXIT
echo "== real Apache Pulsar broker"
e2e/pulsar/pulsar.sh start
eval "$(e2e/pulsar/pulsar.sh env | sed 's/^/export /')"

echo "== go test (unit and end to end, real broker at $PULSAR_SERVICE_URL)"
# One package at a time (-p 1): the end-to-end packages start JVMs, Python clients and private
# brokers, and on two cores running them together turns client timeouts into failures.
# shellcheck disable=SC2086
go test -p 1 -count=1 -timeout 60m ${GO_TEST_FLAGS:-} ./... ./e2e/...

FUZZTIME=${FUZZTIME:-5s}
if [ "$FUZZTIME" != 0 ]; then
  FUZZTIME=$FUZZTIME e2e/fuzz.sh
fi
echo "== all tests passed"
