#!/bin/sh
# peers.sh builds the rate-limit services fleetrate serve is compared with
# (cmd/servebench) into benchmarks/bin: envoyproxy/ratelimit from its
# source (cloned, or RATELIMIT_SRC if set), and gubernator v2.13.0 from the
# Go module proxy. They are built here, never added to fleetrate's go.mod.
set -eu
cd "$(dirname "$0")"
bin=$PWD/bin
mkdir -p "$bin"
src=${RATELIMIT_SRC:-}
if [ -z "$src" ]; then
	src=$(mktemp -d)/ratelimit
	git clone --depth 1 https://github.com/envoyproxy/ratelimit "$src"
fi
(cd "$src" && go build -o "$bin/ratelimit" ./src/service_cmd)
GOBIN=$bin go install github.com/gubernator-io/gubernator/v2/cmd/gubernator@v2.13.0
echo "built: $bin/ratelimit $bin/gubernator"
