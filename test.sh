#!/usr/bin/env bash
# The whole test suite: formatting, vet, staticcheck, every test with the
# race detector (real redis-server processes included), brief fuzzing of
# every parser, and one run of every benchmark.
set -euo pipefail
cd "$(dirname "$0")"
log=$(mktemp)
trap 'rm -f "$log"' EXIT

unformatted=$(gofmt -l .)
if [ -n "$unformatted" ]; then
  echo "gofmt would change:"; echo "$unformatted"; exit 1
fi
go vet ./...
go run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./...
go test -race -count=1 -timeout 15m ./... 2>&1 | tee -a "$log"

# Every parser and input boundary is fuzzed briefly on each run; run one
# longer by hand, e.g. go test -fuzz=FuzzLoad -fuzztime=10m ./internal/config
fuzztime=${FUZZTIME:-3s}
targets=(
  ./gcra:FuzzDecide .:FuzzLimitValidate
  ./redisstore:FuzzSlot
  ./transport:FuzzParseRetryAfter
  ./internal/headers:FuzzParseList ./internal/headers:FuzzFormatPolicy
  ./internal/headers:FuzzFormatRateLimit ./internal/headers:FuzzRetryAfter
  ./httplimit:FuzzBucketName
  ./internal/config:FuzzLoad ./internal/server:FuzzJSONAPI
)
fuzzlog=$(mktemp)
trap 'rm -f "$log" "$fuzzlog"' EXIT
for target in "${targets[@]}"; do
  pkg=${target%%:*} name=${target#*:}
  for attempt in 1 2; do
    if go test -run '^$' -fuzz "^${name}\$" -fuzztime "$fuzztime" "$pkg" >"$fuzzlog" 2>&1; then
      break
    fi
    # A failing input is saved under testdata/fuzz and replayed here: that
    # is a real failure. A run that fails without one (the fuzzing engine
    # itself, e.g. a worker killed on a loaded machine) is retried once.
    if ! go test -run "^${name}\$" "$pkg"; then
      echo "fuzzing $name in $pkg found a failing input:"; cat "$fuzzlog"; exit 1
    fi
    if [ "$attempt" -eq 2 ]; then
      echo "fuzzing $name in $pkg failed twice:"; cat "$fuzzlog"; exit 1
    fi
    echo "fuzzing $name in $pkg failed without a failing input; retrying:"; tail -5 "$fuzzlog"
  done
done
echo "fuzzed ${#targets[@]} targets for $fuzztime each"

# The benchmarks module (peers live there, not in the library): compile and
# run its tests and every benchmark once so they stay working.
(cd benchmarks && go vet ./... && go run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./... \
  && go test -count=1 -bench . -benchtime=1x ./...) 2>&1 | tee -a "$log"

passed=$(grep -c '^ok ' "$log" || true)
failed=$(grep -c '^FAIL' "$log" || true)
echo "packages: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
