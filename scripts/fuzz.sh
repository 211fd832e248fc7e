#!/bin/sh
# fuzz.sh runs every Go fuzz target in the module for a short time each
# (docs/fuzzing.md lists them and the property each checks).
# Usage: scripts/fuzz.sh [DURATION [QUICK_DURATION]]
#
# The targets over guest bytes and repository files get DURATION (10s);
# those over small pure functions that were fuzzed for long already (QUICK
# below) get QUICK_DURATION (5s), so that the whole run stays near three
# minutes as targets are added.
set -eu
t=${1:-10s}
quick=${2:-5s}
QUICK="allowlist.FuzzNormalizeName decisionlog.FuzzString decisionlog.FuzzFloat netclass.FuzzClassify termtext.FuzzTermtext tetragon.FuzzValidate"
# SEEDS_ONLY targets are not fuzzed here: their seeds and corpus run in
# `make unit` like any test. httpfilter.FuzzTunnelHello stalls on some
# generated inputs (0 execs/s for 10-20 s, then goes on): until that wait
# is understood it is fuzzed by hand (docs/fuzzing.md), not in CI.
SEEDS_ONLY="httpfilter.FuzzTunnelHello"
go list -f '{{.ImportPath}} {{.Dir}} {{.Name}}' ./... | while read -r pkg dir name; do
	for f in $(grep -ho '^func Fuzz[A-Za-z0-9_]*' "$dir"/*_test.go 2>/dev/null | sed 's/^func //' | sort -u); do
		d=$t
		case " $QUICK " in *" $name.$f "*) d=$quick ;; esac
		case " $SEEDS_ONLY " in *" $name.$f "*)
			echo "fuzz: $pkg $f: seeds only (see SEEDS_ONLY)" >&2
			continue
			;;
		esac
		echo "fuzz: $pkg $f ($d)" >&2
		go test -run='^$' -fuzz="^$f\$" -fuzztime="$d" "$pkg" </dev/null
	done
done
