#!/usr/bin/env bash
# The whole test suite: installs the tools the tests need when they are
# missing, then formatting, vet, staticcheck, every test with the race
# detector (real redis-server processes included), brief fuzzing of every
# parser, and one run of every benchmark.
#
# Every stage runs even when an earlier one fails, so that one failing test
# never hides what the later stages would say; the summary at the end lists
# each stage's outcome and the script fails if any stage did.
set -uo pipefail
cd "$(dirname "$0")"

# The tools the tests need, beside Go 1.26: redis-server and redis-sentinel
# (the store tests start their own on free loopback ports), chromium (the
# status page's browser tests) and promtool, from Debian's prometheus
# package (the alert rules' checks), gcc for the race detector (cgo), and
# Debian's python3-pytest and python3-httpx (the Python client's tests,
# clients/python, run by the system python3).
# Missing ones are installed with apt-get
# (through sudo when not root); where that cannot be done the script stops
# with the one command that does it. FLEETRATE_NO_INSTALL=1 skips installing
# and only reports.
install_cmd="apt-get update && apt-get install -y --no-install-recommends redis-server redis-sentinel chromium prometheus gcc libc6-dev python3-pytest python3-httpx"
# The Python client's tests run on the system's python3 (Debian's packages
# install there), not on a version manager's shim.
python=/usr/bin/python3
[ -x "$python" ] || python=python3
install_tools() {
  local missing=() sudo=
  command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
  command -v redis-sentinel >/dev/null 2>&1 || missing+=(redis-sentinel)
  command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 \
    || [ -n "${FLEETRATE_CHROMIUM:-}" ] || missing+=(chromium)
  command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
  # The race detector needs cgo, and cgo a C compiler: without one, go
  # test -race refuses to run (a bare Debian has none).
  command -v gcc >/dev/null 2>&1 || missing+=(gcc libc6-dev)
  "$python" -c 'import pytest' >/dev/null 2>&1 || missing+=(python3-pytest)
  "$python" -c 'import httpx' >/dev/null 2>&1 || missing+=(python3-httpx)
  [ "${#missing[@]}" -eq 0 ] && return 0
  echo "test.sh: missing ${missing[*]}, which the tests need"
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then sudo=sudo; else missing=(); fi
  fi
  if [ "${FLEETRATE_NO_INSTALL:-}" != 1 ] && [ "${#missing[@]}" -gt 0 ] && command -v apt-get >/dev/null 2>&1 \
    && echo "test.sh: installing them: $sudo apt-get install ${missing[*]}" && $sudo apt-get update && $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"; then
    return 0
  fi
  echo "test.sh: could not install the tools the tests need; run: sudo sh -c '$install_cmd'" >&2
  return 1
}
install_tools || exit 2
# A test whose tool is missing fails (with the install command) rather
# than skipping, here and wherever CI is set.
export FLEETRATE_REQUIRE_TOOLS=1

log=$(mktemp)
fuzzlog=$(mktemp)
trap 'rm -f "$log" "$fuzzlog"' EXIT

results=()
failures=0
# stage NAME CMD...: runs CMD, records how it went and how long it took.
stage() {
  local name=$1 start=$SECONDS status
  shift
  echo "=== stage: $name"
  "$@"
  status=$?
  if [ "$status" -eq 0 ]; then
    results+=("ok    $name ($((SECONDS - start))s)")
  else
    results+=("FAIL  $name ($((SECONDS - start))s, exit $status)")
    failures=$((failures + 1))
  fi
}

gofmt_check() {
  local unformatted
  unformatted=$(gofmt -l .)
  if [ -n "$unformatted" ]; then
    echo "gofmt would change:"; echo "$unformatted"; return 1
  fi
}

staticcheck() { go run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./...; }

tests() { go test -race -count=1 -timeout 15m ./... 2>&1 | tee -a "$log"; }

# Every parser and input boundary is fuzzed briefly on each run; run one
# longer by hand, e.g. go test -fuzz=FuzzLoad -fuzztime=10m ./internal/config
#
# The budget is a count of inputs, not a duration: with a duration, Go
# 1.26's fuzzing coordinator can report its own deadline as a failure
# ("context deadline exceeded", no failing input; golang/go#75804, fixed
# in Go 1.27), which a loaded machine makes likely. 20,000 inputs of each
# of the eleven targets took 42 s, builds included, on an idle 2-core
# machine.
fuzztime=${FUZZTIME:-20000x}
targets=(
  ./gcra:FuzzDecide ./gcra:FuzzSettleBound ./gcra:FuzzPermits .:FuzzLimitValidate ./calendar:FuzzParse
  ./redisstore:FuzzSlot ./redisstore:FuzzPermitKeys ./redisstore:FuzzPermitReply
  ./transport:FuzzParseRetryAfter ./transport/internal/notice:FuzzParse
  ./transport/internal/ratelimitheader:FuzzParse
  ./internal/headers:FuzzParseList ./internal/headers:FuzzFormatPolicy
  ./internal/headers:FuzzFormatRateLimit ./internal/headers:FuzzRetryAfter
  ./httplimit:FuzzBucketName
  ./internal/config:FuzzLoad ./internal/server:FuzzJSONAPI
  ./internal/server:FuzzParseTokens ./internal/server:FuzzParseGrant
  ./benchmarks/cmd/benchdoc:FuzzParseBench ./benchmarks/cmd/benchdoc:FuzzTables
  ./internal/server:FuzzB3
)
# gotest PKG ARGS...: go test ARGS PKG, in the module that holds PKG
# (./benchmarks is a module of its own).
gotest() {
  local pkg=$1
  shift
  case $pkg in
  ./benchmarks/*) (cd benchmarks && go test "$@" "./${pkg#./benchmarks/}") ;;
  *) go test "$@" "$pkg" ;;
  esac
}
fuzz() {
  local target pkg name attempt bad=0
  for target in "${targets[@]}"; do
    pkg=${target%%:*} name=${target#*:}
    for attempt in 1 2; do
      if gotest "$pkg" -run '^$' -fuzz "^${name}\$" -fuzztime "$fuzztime" >"$fuzzlog" 2>&1; then
        break
      fi
      # A failing input is saved under testdata/fuzz and replayed here: that
      # is a real failure. A run that fails without one (the fuzzing engine
      # itself, e.g. a worker killed on a loaded machine) is retried once.
      if ! gotest "$pkg" -run "^${name}\$"; then
        echo "fuzzing $name in $pkg found a failing input:"; cat "$fuzzlog"; bad=1; break
      fi
      if [ "$attempt" -eq 2 ]; then
        echo "fuzzing $name in $pkg failed twice:"; cat "$fuzzlog"; bad=1; break
      fi
      echo "fuzzing $name in $pkg failed without a failing input; retrying:"; tail -5 "$fuzzlog"
    done
  done
  echo "fuzzed ${#targets[@]} targets, $fuzztime each"
  return "$bad"
}

# The benchmarks module (peers live there, not in the library): compile and
# run its tests and every benchmark once so they stay working.
benchmarks() {
  (cd benchmarks && go vet ./... && go run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./... \
    && go test -count=1 -bench . -benchtime=1x ./...) 2>&1 | tee -a "$log"
}

# The Python client (clients/python) against a real fleetrate serve, which
# its tests build once.
python_tests() { "$python" -m pytest -q -p no:cacheprovider clients/python/tests; }

stage gofmt gofmt_check
stage "go vet" go vet ./...
stage staticcheck staticcheck
stage "tests (-race)" tests
stage fuzzing fuzz
stage benchmarks benchmarks
stage python python_tests

passed=$(grep -c '^ok ' "$log" || true)
failed=$(grep -c '^FAIL' "$log" || true)
echo
echo "packages: $passed passed, $failed failed"
grep '^--- FAIL' "$log" | sort | uniq || true
printf '%s\n' "${results[@]}"
if [ "$failures" -gt 0 ]; then
  echo "$failures of ${#results[@]} stages failed"
  exit 1
fi
echo "all ${#results[@]} stages passed in ${SECONDS}s"
