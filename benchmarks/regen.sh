#!/usr/bin/env bash
# Regenerates the tables of docs/BENCHMARKS.md. Each table lies between
# "<!-- NAME:begin -->" and "<!-- NAME:end -->" lines, NAME one of the
# sections below; for each section named (all by default, in the file's
# order) the script runs the section's command, keeps its raw output in
# benchmarks/results/NAME.txt, turns it into the table
# (benchmarks/cmd/benchdoc) and writes it between the markers, headed by
#
#     Measured <date>, commit <hash>, <machine>: `<command>`
#
#     benchmarks/regen.sh                   # every section, about 35 minutes on 2 cores
#     benchmarks/regen.sh memstore outbound # only the sections named
#     benchmarks/regen.sh --quick           # short runs (a few minutes), written into
#                                           # benchmarks/results/BENCHMARKS.quick.md
#     benchmarks/regen.sh --doc FILE ...    # write into FILE instead
#
# --quick runs each command's short version, to check that the commands,
# the conversion and the markers work; its figures are not for the docs,
# so it writes into a copy of the file unless --doc names one. Sections:
# bench fleetbench servebench memstore overlimit fleettest inflight priorities
# outbound mixed meter simulate headersim statuspage. Every section needs redis-server (as
# ./test.sh does); servebench also bin/ratelimit and bin/gubernator, which
# ./peers.sh builds (RATELIMIT_SRC names a local envoyproxy/ratelimit
# checkout): without them it fails, or, with --quick, is skipped.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
out=$here/results
all=(bench fleetbench servebench memstore overlimit fleettest inflight priorities outbound mixed meter simulate headersim statuspage)

quick=0 doc=
sections=()
while [ "$#" -gt 0 ]; do
  case $1 in
  --quick) quick=1 ;;
  --doc) doc=${2:?--doc needs a file}; shift ;;
  -*) echo "regen.sh: unknown flag $1 (want --quick or --doc FILE)" >&2; exit 2 ;;
  *) sections+=("$1") ;;
  esac
  shift
done
[ "${#sections[@]}" -eq 0 ] && sections=("${all[@]}")
mkdir -p "$out"
if [ -z "$doc" ]; then
  doc=$root/docs/BENCHMARKS.md
  if [ "$quick" = 1 ]; then
    cp "$doc" "$out/BENCHMARKS.quick.md"
    doc=$out/BENCHMARKS.quick.md
  fi
fi
doc=$(cd "$(dirname "$doc")" && pwd)/$(basename "$doc")
# Charts go beside the file the tables go into, and only on full runs.
charts=$(dirname "$doc")

tmp=$(mktemp -d)
redis_pid=
cleanup() {
  [ -n "$redis_pid" ] && kill "$redis_pid" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
(cd "$here" && go build -o "$tmp/benchdoc" ./cmd/benchdoc) || exit 1

commit=$(git -C "$root" rev-parse --short HEAD)
dirty=
git -C "$root" diff --quiet HEAD -- . ':!docs' ':!benchmarks/results' || dirty=' (with uncommitted changes)'

# section_cmd NAME: sets cmd (run from the repository's root; quoted in the
# file as it stands), conv (benchdoc's conversion of its standard output)
# and, for the full run, the figures' long form.
section_cmd() {
  local q=$quick
  case $1 in
  bench)
    conv=bench
    cmd="go run ./cmd/fleetrate bench --redis redis://127.0.0.1:$redis_port --json"
    [ "$q" = 1 ] && cmd+=" --duration 200ms --concurrency 1,64" ;;
  fleetbench)
    conv=raw
    if [ "$q" = 1 ]; then cmd="cd benchmarks && go run ./cmd/fleetbench -quick"
    else cmd="cd benchmarks && go run ./cmd/fleetbench -duration 2s -count 3 -chart $charts/bench-redis.png"; fi ;;
  servebench)
    conv=raw
    if [ "$q" = 1 ]; then cmd="cd benchmarks && go run ./cmd/servebench -ratelimit bin/ratelimit -gubernator bin/gubernator -rounds 1 -duration 300ms -callers 1,16"
    else cmd="cd benchmarks && go run ./cmd/servebench -ratelimit bin/ratelimit -gubernator bin/gubernator -rounds 5 -duration 3s"; fi ;;
  memstore)
    conv="gobench -table memstore"
    if [ "$q" = 1 ]; then cmd="go test -run '^\$' -bench BenchmarkNewKeysCapRatio -benchtime 0.2s -count 2 ./memstore"
    else cmd="go test -run '^\$' -bench BenchmarkNewKeysCapRatio -count 8 ./memstore"; fi ;;
  overlimit)
    conv="gobench -table overlimit"
    if [ "$q" = 1 ]; then cmd="go test -run '^\$' -bench BenchmarkRLSHotOverLimit -benchtime 0.2s -count 1 ./internal/server"
    else cmd="go test -run '^\$' -bench BenchmarkRLSHotOverLimit -count 2 ./internal/server"; fi ;;
  fleettest)
    conv=tables
    if [ "$q" = 1 ]; then cmd="go test -count=1 -v -run 'TestFleet(Wait|Cancels)\$' ./internal/harness/fleettest"
    else cmd="go test -race -count=1 -v -run TestFleet ./internal/harness/fleettest"; fi ;;
  inflight)
    conv=tables
    if [ "$q" = 1 ]; then cmd="cd benchmarks && go test -count=1 -v -run TestInFlightFleet ./inflight"
    else cmd="cd benchmarks && go test -count=1 -v -run TestInFlightFleet ./inflight -args -inflight.duration=60s && go test -count=1 -v -run TestInFlightFleet ./inflight -args -inflight.duration=60s -inflight.rate=60"; fi ;;
  priorities)
    conv=tables
    if [ "$q" = 1 ]; then cmd="go test -count=1 -v -run TestFleetPriorityBench ./internal/harness/fleettest -priority.bench=2s"
    else cmd="go test -count=1 -v -run TestFleetPriorityBench ./internal/harness/fleettest -priority.bench=30s"; fi ;;
  outbound)
    conv=tables
    if [ "$q" = 1 ]; then cmd="cd benchmarks && go test -v -run '^\$' -bench Outbound -benchtime 1x -timeout 30m ./outbound -args -outbound.duration=3s -outbound.only=documented"
    else cmd="cd benchmarks && go test -v -run '^\$' -bench Outbound -benchtime 1x -timeout 40m ./outbound -args -outbound.duration=60s"; fi ;;
  mixed)
    conv=tables
    if [ "$q" = 1 ]; then cmd="cd benchmarks && go test -count=1 -v -run TestMixedFleetShort -timeout 10m ./outbound"
    else cmd="cd benchmarks && go test -v -run '^\$' -bench MixedFleet -benchtime 1x -timeout 40m ./outbound -args -outbound.mixed=60s"; fi ;;
  meter)
    conv=tables
    if [ "$q" = 1 ]; then cmd="cd benchmarks && go test -count=1 -v -run TestMeterFleet -timeout 10m ./meter -args -meter.duration=6s -meter.only='random'"
    else cmd="cd benchmarks && go test -count=1 -v -run TestMeterFleet -timeout 30m ./meter -args -meter.duration=60s"; fi ;;
  headersim)
    conv=tables
    if [ "$q" = 1 ]; then cmd="cd benchmarks && go test -count=1 -run TestSimulatedFleet -v ./outbound -args -outbound.simduration=60s -outbound.only=headers"
    else cmd="cd benchmarks && go test -count=1 -run TestSimulatedFleet -v ./outbound -args -outbound.simduration=300s -outbound.only=headers"; fi ;;
  simulate)
    conv=tables
    if [ "$q" = 1 ]; then cmd="cd benchmarks && go test -count=1 -run TestSimulatedFleet -v ./outbound -args -outbound.simduration=60s"
    else cmd="cd benchmarks && go test -count=1 -run TestSimulatedFleet -v ./outbound -args -outbound.simduration=300s -outbound.simchart=$charts/adaptive-sim.png"; fi ;;
  statuspage)
    conv="gobench -table statuspage"
    if [ "$q" = 1 ]; then cmd="go test -run '^\$' -bench BenchmarkDecisions -benchtime 0.1s -count 1 ./statuspage/"
    else cmd="go test -run '^\$' -bench BenchmarkDecisions -benchtime 1s -count 5 ./statuspage/"; fi ;;
  *)
    echo "regen.sh: unknown section $1 (want one of: ${all[*]})" >&2
    return 1 ;;
  esac
}

# The `fleetrate bench` section measures a redis-server of its own.
start_redis() {
  [ -n "$redis_pid" ] && return 0
  redis_port=$((20000 + RANDOM % 20000))
  redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no >"$tmp/redis.log" 2>&1 &
  redis_pid=$!
  for _ in $(seq 50); do
    redis-cli -p "$redis_port" ping >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "regen.sh: redis-server on port $redis_port did not start:" >&2
  cat "$tmp/redis.log" >&2
  return 1
}

# regen NAME: runs the section's command and writes its table into $doc.
regen() {
  local name=$1 machine body
  redis_port=0
  if [ "$name" = bench ]; then start_redis || return 1; fi
  section_cmd "$name" || return 1
  if [ "$name" = servebench ] && { [ ! -x "$here/bin/ratelimit" ] || [ ! -x "$here/bin/gubernator" ]; }; then
    echo "=== servebench: no bin/ratelimit or bin/gubernator; build them with (cd benchmarks && ./peers.sh)" >&2
    [ "$quick" = 1 ] && { skipped+=(servebench); return 0; }
    return 1
  fi
  machine="$(nproc) CPUs, $(uname -sm), load average $(cut -d' ' -f1 /proc/loadavg) at the start$dirty"
  echo "=== $name: $cmd"
  # Standard output is what the conversion reads; both go to the log.
  if ! (cd "$root" && bash -c "$cmd") >"$tmp/$name.out" 2>"$tmp/$name.err"; then
    cat "$tmp/$name.out" "$tmp/$name.err" >"$out/$name.txt"
    echo "regen.sh: $name failed; its output is in $out/$name.txt" >&2
    tail -20 "$out/$name.txt" >&2
    return 1
  fi
  {
    echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), commit $commit$dirty, $machine"
    echo "# $cmd"
    cat "$tmp/$name.out" "$tmp/$name.err"
  } >"$out/$name.txt"
  if [ "$conv" = raw ]; then
    body=$(cat "$tmp/$name.out")
  else
    # shellcheck disable=SC2086 # conv is the subcommand and its flags
    body=$("$tmp/benchdoc" $conv <"$tmp/$name.out") || return 1
  fi
  printf '%s\n' "$body" | "$tmp/benchdoc" splice -doc "$doc" -section "$name" -date "$(date -u +%Y-%m-%d)" \
    -commit "$commit" -machine "$machine" -command "$cmd"
}

status=0
skipped=()
for s in "${sections[@]}"; do
  regen "$s" || { echo "regen.sh: section $s failed" >&2; status=1; }
done
[ "${#skipped[@]}" -gt 0 ] && echo "skipped: ${skipped[*]}"
echo "tables written into $doc; raw output in $out"
exit "$status"
