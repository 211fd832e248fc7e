#!/bin/sh
# bench.sh prints the filters' speed figures (make bench). Each tool measures
# its filter next to a bare reference server in the same run.
set -eu
cd "$(dirname "$0")/.."
echo "== The abox binary as a process (pinned CPUs, interleaved rounds, names resolved through a DNS server process): proxy vs direct, DNS filter vs bare server and dnsmasq" >&2
go run ./tools/benchproc -abox bin/abox -rounds "${BENCH_ROUNDS:-3}" -d "${BENCH_DURATION:-3s}"
echo "== Allowlist: lookup time and memory at 1k and 100k entries (goal: < 300 ns, < 64 MiB)" >&2
go test -run '^$' -bench 'BenchmarkMatch|BenchmarkBuild' -benchmem ./internal/allowlist
echo "== DNS filter: queries/s and latency, blocked and cached allowed names" >&2
go run ./tools/benchdns -duration "${BENCH_DURATION:-6s}"
echo "== DNS filter: query handler and the batched UDP path without sockets (go test -bench)" >&2
go test -run '^$' -bench 'BenchmarkHandle|BenchmarkDatagram' -benchtime 100000x ./internal/dnsfilter
echo "== HTTP filter: request rules: process CPU per keep-alive request with 100 rules on the host against none, one connection, one run (rules/none, goal <= 1.05; the same rows are the noise floor)" >&2
go test -run '^$' -bench 'BenchmarkRequestRules|BenchmarkCheckRequest' -benchtime "${BENCH_RULES_N:-82000x}" -count "${BENCH_ROUNDS:-3}" ./internal/httpfilter
echo "== HTTP filter: req/s and p50/p99 (plain, tunnel, intercepted), MB/s of a large body, memory per 1,000 tunnels" >&2
go run ./tools/benchhttp
