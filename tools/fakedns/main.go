// Command fakedns serves a small fixed zone on UDP and TCP, for the demo and
// end-to-end tests: an upstream resolver that answers only what it is told.
//
//	fakedns --listen 127.0.0.1:0 --addr-file addr --a example.com=93.184.215.14 --cname www.example.com=example.com
package main

import (
	"bufio"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/abox-dev/abox/internal/testutil/fakedns"
)

// multi is a repeatable string flag.
type multi []string

func (m *multi) String() string     { return strings.Join(*m, ",") }
func (m *multi) Set(v string) error { *m = append(*m, v); return nil }

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "fakedns: %v\n", err)
		os.Exit(1)
	}
}

func run() error {
	var a, aaaa, cname, txt, rr multi
	listen := flag.String("listen", "127.0.0.1:0", "IP:PORT to serve on (UDP and TCP)")
	addrFile := flag.String("addr-file", "", "write the bound IP:PORT to FILE once serving")
	zone := flag.String("zone", "", "read records from FILE, one zone-file line each (\"example.com. 60 IN A 93.184.215.14\")")
	ttl := flag.Int("ttl", 60, "TTL of records given by --a, --aaaa, --cname, --txt")
	flag.Var(&a, "a", "NAME=IPv4, repeatable")
	flag.Var(&aaaa, "aaaa", "NAME=IPv6, repeatable")
	flag.Var(&cname, "cname", "NAME=TARGET, repeatable")
	flag.Var(&txt, "txt", "NAME=TEXT, repeatable")
	flag.Var(&rr, "rr", "a record in zone-file syntax, repeatable")
	flag.Parse()

	var lines []string
	for _, set := range []struct {
		typ  string
		vals multi
	}{{"A", a}, {"AAAA", aaaa}, {"CNAME", cname}, {"TXT", txt}} {
		for _, v := range set.vals {
			name, val, ok := strings.Cut(v, "=")
			if !ok || name == "" || val == "" {
				return fmt.Errorf("--%s %q: want NAME=VALUE", strings.ToLower(set.typ), v)
			}
			switch set.typ {
			case "CNAME":
				val = strings.TrimSuffix(val, ".") + "."
			case "TXT":
				val = fmt.Sprintf("%q", val)
			}
			lines = append(lines, fmt.Sprintf("%s. %d IN %s %s", strings.TrimSuffix(name, "."), *ttl, set.typ, val))
		}
	}
	lines = append(lines, rr...)
	if *zone != "" {
		f, err := os.Open(*zone)
		if err != nil {
			return err
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if l := strings.TrimSpace(sc.Text()); l != "" && !strings.HasPrefix(l, ";") && !strings.HasPrefix(l, "#") {
				lines = append(lines, l)
			}
		}
		f.Close()
		if err := sc.Err(); err != nil {
			return err
		}
	}
	s := fakedns.New()
	if err := s.AddText(lines...); err != nil {
		return err
	}
	if err := s.Start(*listen); err != nil {
		return err
	}
	defer s.Close()
	if *addrFile != "" {
		if err := os.WriteFile(*addrFile+".tmp", []byte(s.Addr+"\n"), 0o644); err != nil {
			return err
		}
		if err := os.Rename(*addrFile+".tmp", *addrFile); err != nil {
			return err
		}
	}
	fmt.Fprintf(os.Stderr, "fakedns: serving %d records on %s\n", len(lines), s.Addr)
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, os.Interrupt, syscall.SIGTERM)
	<-ch
	return nil
}
