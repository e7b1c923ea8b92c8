#!/usr/bin/env bash
# Regenerates every table of docs/BENCHMARKS.md: runs each section's
# command, in the file's order, and writes its raw output to
# benchmarks/results/<section>.txt, headed by the date, the commit and the
# machine. fleetbench rewrites its own tables in docs/BENCHMARKS.md (-doc);
# the other sections' tables are copied by hand from their result files,
# with the header line's date and commit.
#
#     benchmarks/regen.sh                 # every section, about 30 minutes
#     benchmarks/regen.sh fleetbench ...  # only the sections named
#
# Sections: fleetbench servebench memstore overlimit fleettest priorities
# simulate outbound statuspage. servebench needs bin/ratelimit and
# bin/gubernator (./peers.sh builds them; RATELIMIT_SRC names a local
# envoyproxy/ratelimit checkout); every section needs redis-server.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
out=$here/results
mkdir -p "$out"

sections=(fleetbench servebench memstore overlimit fleettest priorities simulate outbound statuspage)
[ "$#" -gt 0 ] && sections=("$@")

# run NAME DIR CMD...: runs CMD in DIR, its output to results/NAME.txt.
run() {
  local name=$1 dir=$2
  shift 2
  echo "=== $name: $*"
  {
    echo "# $(date -u +%Y-%m-%d\ %H:%M\ UTC), commit $(git -C "$root" rev-parse --short HEAD)$(git -C "$root" diff --quiet || echo ' (uncommitted changes)'), $(nproc) CPUs, $(uname -sm), load average $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "# (cd ${dir#"$root"/} && $*)"
    (cd "$dir" && "$@") 2>&1
  } | tee "$out/$name.txt"
}

status=0
for s in "${sections[@]}"; do
  case $s in
  fleetbench)
    run fleetbench "$here" go run ./cmd/fleetbench -duration 2s -count 3 -chart ../docs/bench-redis.png -doc ../docs/BENCHMARKS.md ;;
  servebench)
    run servebench "$here" go run ./cmd/servebench -ratelimit bin/ratelimit -gubernator bin/gubernator -rounds 5 -duration 3s ;;
  memstore)
    run memstore "$root" go test -run '^$' -bench BenchmarkNewKeysCapRatio -count 8 ./memstore ;;
  overlimit)
    run overlimit "$root" go test -run '^$' -bench BenchmarkRLSHotOverLimit -count 2 ./internal/server ;;
  fleettest)
    run fleettest "$root" go test -race -count=1 -v -run TestFleet ./internal/harness/fleettest ;;
  priorities)
    run priorities "$root" go test -count=1 -v -run TestFleetPriorityBench ./internal/harness/fleettest -priority.bench=30s ;;
  simulate)
    run simulate "$here" go test -count=1 -run TestSimulatedFleet -v ./outbound \
      -args -outbound.simduration=300s -outbound.simchart="$root/docs/adaptive-sim.png" ;;
  outbound)
    run outbound "$here" go test -v -run '^$' -bench Outbound -benchtime 1x -timeout 30m ./outbound -args -outbound.duration=60s ;;
  statuspage)
    run statuspage "$root" go test -run '^$' -bench BenchmarkDecisions -benchtime 1s -count 5 ./statuspage/ ;;
  *)
    echo "regen.sh: unknown section $s (want one of: fleetbench servebench memstore overlimit fleettest priorities simulate outbound statuspage)" >&2
    exit 2 ;;
  esac || status=1
done
echo "results in $out; copy each table into docs/BENCHMARKS.md with its header line's date and commit"
exit "$status"
