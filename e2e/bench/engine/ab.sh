#!/usr/bin/env bash
# ab.sh: the rebatch engine's in-process rate (BenchmarkUnbatchedSends) at another commit and at
# the working tree, interleaved in one run, each on one pinned core (GOMAXPROCS=1, taskset), and
# the ratio of the medians side by side.
#
#   e2e/bench/engine/ab.sh BASE_COMMIT [ROUNDS] [BENCH_REGEXP]
#
# ROUNDS (default 10) runs of each build alternate, 1 s per policy each; a median over them
# damps a noisy machine. Nothing is asserted: it prints figures.
set -euo pipefail
base=${1:?usage: ab.sh BASE_COMMIT [ROUNDS] [BENCH_REGEXP]}
rounds=${2:-10}
bench=${3:-BenchmarkUnbatchedSends}
repo=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
tmp=$(mktemp -d)
trap 'git -C "$repo" worktree remove --force "$tmp/base" >/dev/null 2>&1 || true; rm -rf "$tmp"' EXIT
git -C "$repo" worktree add -q --detach "$tmp/base" "$base"
(cd "$tmp/base" && go test -c -o "$tmp/base.test" ./rebatch)
(cd "$repo" && go test -c -o "$tmp/head.test" ./rebatch)
cpu=$(($(nproc) - 1))
for _ in $(seq "$rounds"); do
	for b in base head; do
		GOMAXPROCS=1 taskset -c "$cpu" "$tmp/$b.test" -test.run '^$' -test.bench "$bench" \
			-test.benchtime 1s -test.benchmem | grep '^Benchmark' | sed "s/^/$b /" >>"$tmp/out"
	done
done
python3 - "$tmp/out" "$base" <<'PY'
import re, statistics, sys
rates, allocs = {}, {}
for line in open(sys.argv[1]):
    build, name = line.split()[:2]
    m = re.search(r'([\d.]+) msgs/s', line)
    if m:
        rates.setdefault((name, build), []).append(float(m.group(1)))
    m = re.search(r'(\d+) allocs/op', line)
    if m:
        allocs[(name, build)] = m.group(1)
names = sorted({n for n, _ in rates})
print(f"{'benchmark':34s} {'base '+sys.argv[2][:9]:>16s} {'working tree':>14s}  ratio  (median messages/s of {len(rates[(names[0], 'base')])} runs; allocs/op base, head)")
for n in names:
    b, h = statistics.median(rates[(n, 'base')]), statistics.median(rates[(n, 'head')])
    print(f"{n:34s} {b/1e6:14.2f} M {h/1e6:12.2f} M  {h/b:5.2f}x  {allocs.get((n,'base'),'?')}, {allocs.get((n,'head'),'?')}")
PY
