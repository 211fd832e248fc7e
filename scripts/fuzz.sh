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
# Every input that widens coverage is minimized in the worker that found
# it before the coordinator hears of any of that worker's executions, for
# up to -fuzzminimizetime (60 s by default), and the minimizer's pass over
# a []byte input is quadratic in its length: targets whose inputs are
# kilobytes (FuzzTunnelHello's ClientHellos carry a post-quantum key share
# of 1.2 KB) then sat at "0 execs/sec" for the whole minute, both workers
# minimizing and nothing fuzzed. A short run wants executions, not small
# corpus files: each minimization (of a new input or of a failure, which
# is written all the same) gets $MINIMIZE executions.
MINIMIZE=${FUZZ_MINIMIZE:-1000x}
# fuzz_one runs one target. Go 1.26's fuzzing coordinator can fail a run
# that found nothing with a bare "context deadline exceeded" as the fuzz
# time ends (golang/go#75804, fixed in Go 1.27): such a run, with no
# failing input written, is run again, twice at most. Any other failure,
# and every run that wrote an input, fails at once.
fuzz_one() {
	out=$(mktemp)
	for try in 1 2 3; do
		if go test -run='^$' -fuzz="^$2\$" -fuzztime="$3" -fuzzminimizetime="$MINIMIZE" "$1" </dev/null >"$out" 2>&1; then
			cat "$out"
			rm -f "$out"
			return 0
		fi
		cat "$out"
		if [ "$try" = 3 ] || ! grep -q 'context deadline exceeded' "$out" || grep -q 'Failing input written' "$out"; then
			rm -f "$out"
			return 1
		fi
		echo "fuzz: $1 $2: the coordinator's deadline race (golang/go#75804), nothing found; again" >&2
	done
}

go list -f '{{.ImportPath}} {{.Dir}} {{.Name}}' ./... | while read -r pkg dir name; do
	for f in $(grep -ho '^func Fuzz[A-Za-z0-9_]*' "$dir"/*_test.go 2>/dev/null | sed 's/^func //' | sort -u); do
		d=$t
		case " $QUICK " in *" $name.$f "*) d=$quick ;; esac
		echo "fuzz: $pkg $f ($d)" >&2
		fuzz_one "$pkg" "$f" "$d"
	done
done
