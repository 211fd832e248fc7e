#!/bin/sh
# fuzz.sh runs every Go fuzz target in the module for a short time each.
# Usage: scripts/fuzz.sh [DURATION]
set -eu
t=${1:-10s}
for pkg in $(go list ./...); do
	dir=$(go list -f '{{.Dir}}' "$pkg")
	for f in $(grep -ho '^func Fuzz[A-Za-z0-9_]*' "$dir"/*_test.go 2>/dev/null | sed 's/^func //' | sort -u); do
		echo "fuzz: $pkg $f ($t)" >&2
		go test -run='^$' -fuzz="^$f\$" -fuzztime="$t" "$pkg"
	done
done
