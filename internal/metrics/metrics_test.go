package metrics

import (
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// Reason labels are a closed set whatever callers pass: a host name or a
// path folds into OtherReason, and so does every code past MaxReasons.
func TestDecisionsLabelsAreBounded(t *testing.T) {
	reg := New("dev")
	vec := reg.Decisions(LayerHTTP, "abox_test_decisions_total", "test", "kind")
	d := vec.For("http")
	d.Inc("allow", "allowlisted")
	d.Inc("allow", "allowlisted")
	d.Inc("block", "evil.example.com")
	d.Inc("block", "/etc/passwd")
	d.Inc("block", strings.Repeat("a", maxReasonLen+1))
	d.Inc("maybe", "allowlisted")
	for i := range MaxReasons + 10 {
		d.Inc("block", fmt.Sprintf("code_%d", i))
	}
	for i := range 1000 { // junk must not grow the table either
		d.Inc("block", fmt.Sprintf("host%d.example", i))
	}
	if got := testutil.ToFloat64(vec.vec.WithLabelValues("http", "allow", "allowlisted")); got != 2 {
		t.Errorf("allow/allowlisted = %v, want 2", got)
	}
	if got := testutil.ToFloat64(vec.vec.WithLabelValues("http", "other", "allowlisted")); got != 1 {
		t.Errorf("an unknown verdict counted %v times under verdict other, want 1", got)
	}
	// MaxReasons children: allow and other/allowlisted, and
	// MaxReasons-2 of block/code_N.
	wantOther := float64(3 + (MaxReasons + 10 - (MaxReasons - 2)) + 1000)
	if got := testutil.ToFloat64(vec.vec.WithLabelValues("http", "block", OtherReason)); got != wantOther {
		t.Errorf("block/other = %v, want %v", got, wantOther)
	}
	if n := testutil.CollectAndCount(vec.vec); n > MaxReasons+3 {
		t.Errorf("%d series, want at most %d", n, MaxReasons+3)
	}
	if n := len(d.table.Load().block); n > 2*MaxReasons+1 {
		t.Errorf("the block table holds %d reasons: junk grows it", n)
	}
	var nilD *Decisions
	nilD.Inc("allow", "allowlisted") // metrics off: no panic, nothing counted
}

// Counting from many goroutines loses nothing while children are built.
func TestDecisionsConcurrent(t *testing.T) {
	reg := New("dev")
	vec := reg.Decisions(LayerDNS, "abox_test_total", "test")
	d := vec.For()
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 1000 {
				d.Inc("block", fmt.Sprintf("r%d", (g+i)%10))
			}
		})
	}
	wg.Wait()
	var total float64
	for i := range 10 {
		total += testutil.ToFloat64(vec.vec.WithLabelValues("block", fmt.Sprintf("r%d", i)))
	}
	if total != 8000 {
		t.Errorf("counted %v, want 8000", total)
	}
}

// The hot path allocates nothing once a child exists.
func TestDecisionsIncAllocatesNothing(t *testing.T) {
	d := New("dev").Decisions(LayerDNS, "abox_test_total", "test").For()
	d.Inc("allow", "allowlisted")
	if n := testing.AllocsPerRun(1000, func() { d.Inc("allow", "allowlisted") }); n != 0 {
		t.Errorf("Inc allocates %v times per call", n)
	}
	// More reasons than cache slots, used in turn: those without a slot
	// go through the table, still without allocating.
	reasons := make([]string, hotSlots+8)
	for i := range reasons {
		reasons[i] = fmt.Sprintf("code_%d", i)
		d.Inc("block", reasons[i])
	}
	if n := testing.AllocsPerRun(100, func() {
		for _, r := range reasons {
			d.Inc("block", r)
		}
	}); n != 0 {
		t.Errorf("Inc over %d reasons in turn allocates %v times per round", len(reasons), n)
	}
}

func BenchmarkDecisionsInc(b *testing.B) {
	d := New("dev").Decisions(LayerDNS, "abox_test_total", "test").For()
	b.ReportAllocs()
	for b.Loop() {
		d.Inc("allow", "allowlisted")
	}
}
