package connio

import (
	"net"
	"syscall"
	"testing"
	"time"
)

// BenchmarkTunnelCopy relays b.N MiB through pipe between two loopback TCP
// connections and reports the CPU time the whole process spent per GiB.
func BenchmarkTunnelCopy(b *testing.B) {
	guest, clientEnd := tcpPairB(b)
	upEnd, origin := tcpPairB(b)
	var a, u net.Conn = NewIdleConn(clientEnd, time.Minute, nil), NewIdleConn(upEnd, time.Minute, nil)
	go Pipe(a, u, nil)
	n := int64(b.N) << 20
	b.SetBytes(1 << 20)
	var r0, r1 syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &r0)
	b.ResetTimer()
	go func() {
		buf := make([]byte, 256<<10)
		for left := n; left > 0; {
			k, err := origin.Write(buf[:min(left, int64(len(buf)))])
			if err != nil {
				break
			}
			left -= int64(k)
		}
		origin.(*net.TCPConn).CloseWrite()
	}()
	var got int64
	buf := make([]byte, 256<<10)
	for {
		k, err := guest.Read(buf)
		got += int64(k)
		if err != nil {
			break
		}
	}
	b.StopTimer()
	syscall.Getrusage(syscall.RUSAGE_SELF, &r1)
	if got != n {
		b.Fatalf("got %d want %d", got, n)
	}
	cpu := time.Duration(syscall.TimevalToNsec(r1.Utime) - syscall.TimevalToNsec(r0.Utime) + syscall.TimevalToNsec(r1.Stime) - syscall.TimevalToNsec(r0.Stime))
	b.ReportMetric(float64(cpu.Milliseconds())/(float64(n)/(1<<30)), "cpu-ms/GiB")
}

func tcpPairB(b *testing.B) (net.Conn, net.Conn) {
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	defer ln.Close()
	acc := make(chan net.Conn, 1)
	go func() { c, _ := ln.Accept(); acc <- c }()
	c, _ := net.Dial("tcp", ln.Addr().String())
	s := <-acc
	b.Cleanup(func() { c.Close(); s.Close() })
	return c, s
}
