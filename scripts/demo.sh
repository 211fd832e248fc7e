#!/bin/sh
# demo.sh shows the DNS filter standalone on loopback (make demo): an allowed
# name, a blocked one with its reason, a rebinding attempt, the healthcheck,
# status, a live allowlist change and the decision log. Needs bin/abox
# (make build), go, and dig (installed from dnsutils when run as root).
set -eu
cd "$(dirname "$0")/.."

ABOX=$(pwd)/bin/abox
[ -x "$ABOX" ] || { echo "demo: $ABOX missing; run make build (or make demo)" >&2; exit 1; }
if ! command -v dig >/dev/null 2>&1; then
	if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
		echo "demo: installing dnsutils for dig" >&2
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dnsutils >/dev/null
	fi
	command -v dig >/dev/null 2>&1 || { echo "demo: dig not found; install dnsutils (apt-get install dnsutils)" >&2; exit 1; }
fi

tmp=$(mktemp -d)
export ABOX_HOME="$tmp/home"
pids=""
cleanup() {
	for p in $pids; do kill "$p" 2>/dev/null || true; done
	for p in $pids; do wait "$p" 2>/dev/null || true; done
	rm -rf "$tmp"
}
trap cleanup EXIT INT TERM

heading() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
wait_for() { # FILE: wait up to 10s for FILE to hold something
	i=0
	while [ ! -s "$1" ]; do
		i=$((i + 1))
		[ $i -le 100 ] || { echo "demo: timed out waiting for $1" >&2; cat "$tmp"/*.err >&2 2>/dev/null; exit 1; }
		sleep 0.1
	done
}

# The upstream: a fake resolver that knows a public and an internal address.
go build -o "$tmp/fakedns" ./tools/fakedns
"$tmp/fakedns" --listen 127.0.0.1:0 --addr-file "$tmp/upstream.addr" \
	--a example.com=93.184.215.14 \
	--cname www.example.com=cdn.example.net --a cdn.example.net=93.184.215.15 \
	--a internal.example.com=10.0.0.5 \
	--a other.org=93.184.216.34 2>"$tmp/fakedns.err" &
pids="$pids $!"
wait_for "$tmp/upstream.addr"
upstream=$(cat "$tmp/upstream.addr")

printf 'example.com\n*.example.com\n' >"$tmp/allowlist.txt"

heading "Starting: abox dns serve --listen 127.0.0.1:0 --allowlist allowlist.txt --upstream $upstream"
echo "allowlist:"; sed 's/^/    /' "$tmp/allowlist.txt"
"$ABOX" dns serve --listen 127.0.0.1:0 --allowlist "$tmp/allowlist.txt" --upstream "$upstream" \
	--log-file "$tmp/dns.log" 2>"$tmp/serve.err" &
pids="$pids $!"
i=0
until grep -q "dns filter for" "$tmp/serve.err" 2>/dev/null; do
	i=$((i + 1))
	[ $i -le 100 ] || { echo "demo: the filter did not start:" >&2; cat "$tmp/serve.err" >&2; exit 1; }
	sleep 0.1
done
addr=$(sed -n 's/.* on \([0-9.]*:[0-9]*\) (udp+tcp).*/\1/p' "$tmp/serve.err" | head -n1)
port=${addr##*:}
sed 's/^/    /' "$tmp/serve.err"

q() { # NAME [TYPE]: ask the filter, print status, EDE and answer lines
	echo "\$ dig @127.0.0.1 -p $port $*"
	dig @127.0.0.1 -p "$port" +tries=1 +time=3 +noall +comments +answer "$@" |
		grep -E 'status:|EDE:|[[:space:]]IN[[:space:]]' | sed 's/^;*[[:space:]]*/    /'
}

heading "An allowlisted name is resolved through the upstream"
q example.com
heading "A CDN alias works: the CNAME targets need not be listed, their addresses are checked"
q www.example.com
heading "A name that is not listed gets NXDOMAIN with an Extended DNS Error giving the reason"
q other.org
heading "Rebinding: a listed name that resolves to a private address is blocked"
q internal.example.com
heading "The healthcheck name answers locally, whatever the allowlist"
q healthcheck.abox.local
heading "Zone transfers and other classes are refused"
q +tcp example.com AXFR
q -c CH -t TXT version.bind
heading "Status and counters: abox dns status standalone"
"$ABOX" dns status standalone | sed 's/^/    /'
heading "Live change: abox allowlist add standalone other.org"
"$ABOX" allowlist add standalone other.org 2>&1 | sed 's/^/    /'
q other.org
heading "The decision log: abox dns logs standalone -n 6"
"$ABOX" dns logs standalone -n 6 | sed 's/^/    /'
printf '\ndemo: done (stopping the filter and the fake upstream)\n'
