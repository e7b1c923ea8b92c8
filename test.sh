#!/usr/bin/env bash
# The whole test suite: formatting, vet, staticcheck, and every test with
# the race detector (real redis-server processes included).
set -euo pipefail
cd "$(dirname "$0")"
unformatted=$(gofmt -l .)
if [ -n "$unformatted" ]; then
  echo "gofmt would change:"; echo "$unformatted"; exit 1
fi
go vet ./...
go run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./...
go test -race -count=1 -timeout 15m ./...
# Every parser and input boundary is fuzzed briefly on each run; run one
# longer by hand, e.g. go test -fuzz=FuzzLoad -fuzztime=10m ./internal/config
fuzztime=${FUZZTIME:-3s}
for target in \
  .:FuzzDecide .:FuzzLimitValidate \
  ./redisstore:FuzzSlot \
  ./transport:FuzzParseRetryAfter \
  ./internal/headers:FuzzParseList ./internal/headers:FuzzFormatPolicy \
  ./internal/headers:FuzzFormatRateLimit ./internal/headers:FuzzRetryAfter \
  ./httplimit:FuzzBucketName \
  ./internal/config:FuzzLoad ./internal/server:FuzzJSONAPI; do
  go test -run '^$' -fuzz "^${target#*:}\$" -fuzztime "$fuzztime" "${target%%:*}" >/dev/null \
    || { echo "fuzzing ${target} failed:"; go test -run "^${target#*:}\$" "${target%%:*}"; exit 1; }
done
echo "fuzzed 11 targets for $fuzztime each"
# The benchmarks module (peers live there, not in the library): compile and
# run every benchmark once so they stay working.
(cd benchmarks && go vet ./... && go run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./... \
  && go test -count=1 -run '^$' -bench . -benchtime=1x ./...)
