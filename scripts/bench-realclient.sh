#!/bin/sh
# bench-realclient.sh times real package managers installing a real
# dependency tree directly and through `abox http serve` on loopback (the
# instance CA trusted, names resolved through the host's resolver), same
# machine, alternating, ROUNDS times each. It prints one line per run and
# the proxy's refusals, which must be none.
#
#   sh scripts/bench-realclient.sh            # go mod download of this module, npm install express
#   ROUNDS=1 CLIENTS=go sh scripts/bench-realclient.sh
#
# On the lab machines the registries resolve to 203.0.113.80 (a documentation
# range), hence --allow-private 203.0.113.80/32; set ALLOW_PRIVATE to change it.
set -eu
cd "$(dirname "$0")/.."
ABOX=${ABOX:-bin/abox}
ROUNDS=${ROUNDS:-3}
CLIENTS=${CLIENTS:-go npm}
ALLOW_PRIVATE=${ALLOW_PRIVATE:-203.0.113.80/32}
PORT=${PORT:-28310}
MOD=$(pwd)
W=$(mktemp -d /tmp/abox-realclient.XXXXXX)
echo "work: $W" >&2
printf 'proxy.golang.org\nsum.golang.org\nregistry.npmjs.org\n' >"$W/allow.txt"
ABOX_HOME=$W/home "$ABOX" http serve --listen 127.0.0.1:$PORT --allowlist "$W/allow.txt" \
	--allow-private "$ALLOW_PRIVATE" --ca-dir "$W/ca" --log-file "$W/http.log" 2>"$W/serve.err" &
PID=$!
trap 'kill $PID 2>/dev/null; wait $PID 2>/dev/null; [ -n "${KEEP:-}" ] || rm -rf "$W"' EXIT
for _ in $(seq 50); do [ -s "$W/ca/ca.crt" ] && grep -q "http filter" "$W/serve.err" && break; sleep 0.1; done
cat /etc/ssl/certs/ca-certificates.crt "$W/ca/ca.crt" >"$W/roots.pem"
PROXY=http://127.0.0.1:$PORT

now() { date +%s.%N; }
run() { # run NAME VIA COMMAND...: time one run, print "NAME VIA seconds exit"
	name=$1 via=$2
	shift 2
	t0=$(now)
	if "$@" >"$W/out.log" 2>&1; then rc=0; else rc=$?; fi
	t1=$(now)
	printf '%-4s %-6s %6.2f s  exit %s\n' "$name" "$via" "$(echo "$t1 - $t0" | bc)" "$rc"
	[ "$rc" = 0 ] || tail -5 "$W/out.log"
}
gomod() { # gomod VIA N
	d=$W/gomod-$1-$2
	if [ "$1" = proxy ]; then
		(cd "$MOD" && GOMODCACHE=$d GOFLAGS=-modcacherw HTTPS_PROXY=$PROXY HTTP_PROXY=$PROXY SSL_CERT_FILE=$W/roots.pem go mod download)
	else
		(cd "$MOD" && GOMODCACHE=$d GOFLAGS=-modcacherw go mod download)
	fi
}
npmi() { # npmi VIA N
	d=$W/npm-$1-$2
	mkdir -p "$d" && cd "$d" && echo '{"name":"t","version":"1.0.0"}' >package.json
	if [ "$1" = proxy ]; then
		npm install express --cache "$d/.cache" --no-audit --no-fund --https-proxy "$PROXY" --proxy "$PROXY" --cafile "$W/roots.pem"
	else
		npm install express --cache "$d/.cache" --no-audit --no-fund
	fi
}
for i in $(seq "$ROUNDS"); do
	for c in $CLIENTS; do
		case $c in
		go) run go direct gomod direct "$i"; run go proxy gomod proxy "$i" ;;
		npm) run npm direct npmi direct "$i"; run npm proxy npmi proxy "$i" ;;
		esac
	done
done
total=$(grep -c '"msg":"request"' "$W/http.log" || true)
bad=$(grep '"msg":"request"' "$W/http.log" | grep -Evc '"verdict":"allow".*"status":[23][0-9][0-9]|"status":[23][0-9][0-9].*"verdict":"allow"' || true)
echo "proxied requests and tunnels: $total, refused or failed: $bad"
grep '"msg":"request"' "$W/http.log" | grep -Ev '"verdict":"allow".*"status":[23][0-9][0-9]|"status":[23][0-9][0-9].*"verdict":"allow"' | head -5 || true
