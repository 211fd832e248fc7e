package dnsfilter_test

import (
	"os"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// TestUDPServingSurvivesSignals: signals arriving while a reader waits in
// a receive (a socket with a receive timeout is not restarted after a
// signal: the call fails with EINTR) neither stop the serving nor lose an
// answer. The runtime's own preemption signal, SIGURG, is sent to every
// thread of the process the whole time.
func TestUDPServingSurvivesSignals(t *testing.T) {
	h := start(t, harnessOptions{})
	h.ask(t, "example.com", dns.TypeA) // cached from here on
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			tasks, _ := os.ReadDir("/proc/self/task")
			for _, task := range tasks {
				if tid, err := strconv.Atoi(task.Name()); err == nil {
					syscall.Tgkill(os.Getpid(), tid, syscall.SIGURG)
				}
			}
			time.Sleep(200 * time.Microsecond)
		}
	})
	defer func() { close(stop); wg.Wait() }()
	for i := range 300 {
		name := "example.com"
		if i%2 == 1 {
			name = "other.org"
		}
		r := h.ask(t, name, dns.TypeA)
		if want := map[string]string{"example.com": "NOERROR", "other.org": "NXDOMAIN"}[name]; rcode(r) != want {
			t.Fatalf("query %d (%s): rcode %s, want %s", i, name, rcode(r), want)
		}
		if i%50 == 0 {
			time.Sleep(150 * time.Millisecond) // let a reader wait out a receive timeout under signals
		}
	}
}
