package daemon

import (
	"bytes"
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/abox-dev/abox/internal/decisionlog"
)

// TestAllowedFloodKeepsRefusals: a guest that floods the DNS filter with
// allowed queries rotates the decision log's files until an early block
// line is gone from them, but not from the refusal stream
// (dns.refusals.log, and its ring behind `abox dns logs --refusals`),
// which allowed lines never enter. The files are rotated at 1 MB here
// (50 MB in production) so that the flood takes seconds.
func TestAllowedFloodKeepsRefusals(t *testing.T) {
	dir := t.TempDir()
	dnsLog := filepath.Join(dir, "logs", "dns.log")
	p := startPlaneLogs(t, DNSConfig{RateLimit: -1}, HTTPConfig{}, LogConfig{DNSFile: dnsLog, HTTPFile: filepath.Join(dir, "logs", "http.log"), FileMaxMB: 1})
	const evidence = "exfil-attempt.blocked.test"
	if rc := p.query(t, evidence+"."); rc != dns.RcodeNameError {
		t.Fatalf("%s: rcode %s, want NXDOMAIN", evidence, dns.RcodeToString[rc])
	}

	// The flood: (1 + DefaultBackups) files of 1 MB and more, in allowed
	// lines, from one client, as fast as it is answered.
	floodAllowed(t, p.info.DNSAddr.String(), "allowed.test.", 6<<20)

	retained := func(pattern string) string {
		t.Helper()
		files, _ := filepath.Glob(filepath.Join(dir, "logs", pattern))
		var all bytes.Buffer
		for _, f := range files {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			all.Write(b)
		}
		return all.String()
	}
	// lumberjack removes old files from a goroutine of its own: wait for
	// the decision log to hold no more than its cap.
	deadline := time.Now().Add(10 * time.Second)
	for {
		files, _ := filepath.Glob(filepath.Join(dir, "logs", "dns-*.log"))
		if len(files) <= decisionlog.DefaultBackups || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if strings.Contains(retained("dns*.log"), `"name":"allowed.test"`) == false {
		t.Fatal("no allowed line in the decision log: the flood did not reach it")
	}
	if main := retained("dns.log") + retained("dns-*.log"); strings.Contains(main, evidence) {
		t.Fatalf("the flood did not rotate the block line out of the decision log; the test proves nothing")
	}
	kept := retained("dns.refusals*.log")
	if !strings.Contains(kept, `"name":"`+evidence+`"`) {
		t.Fatalf("the block line is gone from the refusal stream too:\n%.2000s", kept)
	}
	if strings.Contains(kept, `"verdict":"allow"`) {
		t.Fatal("an allowed line reached the refusal stream")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	b, err := p.api.Logs(ctx, "dns"+RefusalsSuffix, 100, 0)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, l := range b.Lines {
		found = found || strings.Contains(string(l), evidence)
	}
	if !found {
		t.Fatalf("the refusal ring lost the block line: %d lines", len(b.Lines))
	}
}

// floodAllowed sends queries for name from one socket, 32 in flight,
// until the answers add up to about bytes of decision lines (a line is
// about 200 bytes).
func floodAllowed(t *testing.T, addr, name string, bytes int) {
	t.Helper()
	c, err := net.Dial("udp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	q := new(dns.Msg).SetQuestion(name, dns.TypeA)
	wire, err := q.Pack()
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 2048)
	want := bytes / 200
	answered := 0
	for answered < want {
		for range 32 {
			c.Write(wire)
		}
		c.SetReadDeadline(time.Now().Add(time.Second))
		for range 32 {
			if _, err := c.Read(buf); err != nil {
				break
			}
			answered++
		}
	}
}
