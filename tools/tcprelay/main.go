// Command tcprelay is the benchmark's ceiling reference: a bare TCP relay
// that forwards every connection it accepts to one address, byte for byte,
// with no HTTP work at all. The origin fixture takes the absolute-form
// requests a proxy client sends, so the relay stands in for a proxy in the
// plain-HTTP tests. No proxy can beat it where the client side is the
// limit: what it reaches, against the direct reference in the same round, is
// the best any proxy can do in that topology (tools/benchproc).
//
//	tcprelay -listen 127.0.0.1:9000 -to 127.0.0.1:8080
package main

import (
	"flag"
	"io"
	"log"
	"net"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "address to accept connections on")
	to := flag.String("to", "", "address every connection is relayed to")
	flag.Parse()
	log.SetFlags(0)
	if *to == "" {
		log.Fatal("tcprelay: -to ADDR is required")
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatalf("tcprelay: %v", err)
	}
	for {
		c, err := ln.Accept()
		if err != nil {
			log.Fatalf("tcprelay: %v", err)
		}
		go relay(c.(*net.TCPConn), *to)
	}
}

// relay copies both ways until either side ends, then closes both.
func relay(c *net.TCPConn, to string) {
	defer c.Close()
	u, err := net.Dial("tcp", to)
	if err != nil {
		return
	}
	defer u.Close()
	done := make(chan struct{}, 2)
	cp := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		done <- struct{}{}
	}
	go cp(u, c)
	go cp(c, u)
	<-done
}
