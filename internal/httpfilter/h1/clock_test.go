package h1

import (
	"net"
	"testing"
	"time"
)

// TestHeaderClockStaysStopped: a header clock's timer that fires while
// its connection is being closed does not arm itself again (it would keep
// the closed connection's clock alive, firing for ever).
func TestHeaderClockStaysStopped(t *testing.T) {
	a, b := net.Pipe()
	defer b.Close()
	var k HeaderClock
	k.Start(a, time.Hour)
	k.Stop()
	k.check() // the timer's callback, running concurrently with stop
	if k.t.Load().Stop() {
		t.Fatal("the clock's timer was armed again after stop")
	}
	if k.expired.Load() {
		t.Fatal("a stopped clock expired")
	}
}
