package project

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/abox-dev/abox/internal/api"
	"github.com/abox-dev/abox/internal/policy"
)

// TestSyncAllowlistByLine: up makes the instance's list the file's line by
// line, a name changing between no rules and rules included, in both
// directions.
func TestSyncAllowlistByLine(t *testing.T) {
	dir, err := os.MkdirTemp("", "abxsync") // short: unix socket paths are limited
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	eng, err := policy.New(policy.Config{AllowlistPath: filepath.Join(dir, "allow.txt")})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := api.Listen(filepath.Join(dir, "api.sock"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- (&api.Server{Instance: "dev", Policy: eng}).Serve(ctx, ln) }()
	t.Cleanup(func() { cancel(); <-done })
	c := api.NewClient(filepath.Join(dir, "api.sock"))

	steps := [][]string{
		{"example.com", "api.github.com"},
		{"example.com", "api.github.com GET,HEAD /**", "api.github.com POST /repos/acme/app/pulls"},
		{"example.com", "api.github.com GET,HEAD /**"},
		{"api.github.com"},
	}
	for i, want := range steps {
		if _, err := syncAllowlist(context.Background(), c, want); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		var got []string
		for _, l := range eng.List().Lines() {
			got = append(got, l.String())
		}
		if strings.Join(got, "|") != strings.Join(want, "|") {
			t.Errorf("step %d: lines in force %q, want %q", i, got, want)
		}
	}
}
