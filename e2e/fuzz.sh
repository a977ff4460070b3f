#!/usr/bin/env bash
# fuzz.sh: every fuzz target of the repository, one after another, for FUZZTIME each.
#
#   e2e/fuzz.sh                 FUZZTIME [5s]
#
# Run by e2e/test.sh after the tests, and by `make fuzz`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
FUZZTIME=${FUZZTIME:-5s}

# fuzz_one runs one fuzz target for FUZZTIME. Go 1.26's fuzzing coordinator can fail a target
# with a bare "context deadline exceeded" when -fuzztime expires while a worker is mid-call
# (go.dev/issue/75804, fixed in Go 1.27): no input failed and none is written. It strikes about
# one 5-second run in ten of a fast target, so with some twenty targets one try each would fail
# CI on no finding several times in a hundred runs. Exactly that outcome is run again, up to
# four tries in all; any other failure (a failing input written, a panic, a t.Fatal) fails at
# once.
fuzz_one() {
  local pkg=$1 target=$2 out rc attempt
  for attempt in 1 2 3 4; do
    rc=0
    out=$(go test -run='^$' -fuzz="^$target\$" -fuzztime="$FUZZTIME" "$pkg" 2>&1) || rc=$?
    printf '%s\n' "$out"
    [ "$rc" = 0 ] && return 0
    if [ "$attempt" -lt 4 ] && grep -q 'context deadline exceeded' <<<"$out" &&
      ! grep -q -e 'Failing input written to' -e 'panic:' -e '_test.go:[0-9]' <<<"$out"; then
      echo "-- $target: the fuzzing engine's deadline race (go.dev/issue/75804), no failing input; try $((attempt + 1)) of 4"
      continue
    fi
    return "$rc"
  done
}

echo "== fuzz targets, $FUZZTIME each"
git ls-files '*_test.go' | xargs grep -l '^func Fuzz' | while read -r f; do
  pkg=./$(dirname "$f")
  grep -o '^func Fuzz[A-Za-z0-9_]*' "$f" | sed 's/^func //' | while read -r target; do
    echo "-- $pkg $target"
    fuzz_one "$pkg" "$target" </dev/null
  done
done
