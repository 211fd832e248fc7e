package api

import (
	"context"
	"testing"

	"github.com/abox-dev/abox/internal/policy"
)

func TestLearnRoundTrip(t *testing.T) {
	c, eng, _ := startServer(t)
	ctx := context.Background()
	if err := c.SetMode(ctx, policy.Learn); err != nil {
		t.Fatal(err)
	}
	if m, err := c.Mode(ctx); err != nil || m != policy.Learn {
		t.Fatalf("mode = %q, %v; want learn", m, err)
	}
	eng.Observe(policy.Observation{Kind: "inner", Host: "a.example", Port: 443, Method: "PUT", Path: "/x", Status: 201, Allowed: true})
	s, err := c.Learned(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Hosts) != 1 || len(s.Hosts[0].Requests) != 1 || !s.Hosts[0].Requests[0].Write || s.Since.IsZero() {
		t.Fatalf("learned = %+v, want a.example's PUT /x, a write, with a start time", s)
	}
	if err := c.ClearLearned(ctx); err != nil {
		t.Fatal(err)
	}
	if s, err := c.Learned(ctx); err != nil || len(s.Hosts) != 0 {
		t.Errorf("after clear: %+v, %v", s, err)
	}
}
