package daemon

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestRulesOnTunnelledHostRefuseStart: the data plane does not start with
// an allowlist whose request rules the proxy could not enforce (a host it
// tunnels), and says which entry and what to do; without the exception it
// starts.
func TestRulesOnTunnelledHostRefuseStart(t *testing.T) {
	for _, tt := range []struct {
		name       string
		noMITM     bool
		exceptions []string
		want       string
	}{
		{"exception", false, []string{"api.example.org"}, "api.example.org is a MITM exception"},
		{"no-mitm", true, nil, "interception is off"},
		{"fine", false, []string{"other.example.org"}, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			allow := filepath.Join(dir, "allow.txt")
			if err := os.WriteFile(allow, []byte("api.example.org GET /**\nother.example.org\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			ready := make(chan Info, 1)
			done := make(chan error, 1)
			go func() {
				done <- Run(ctx, Config{
					Instance: "t", AllowlistPath: allow, APISocket: filepath.Join(dir, "api.sock"),
					Upstreams: []string{"127.0.0.1:1"},
					HTTP: &HTTPConfig{Listen: "127.0.0.1:0", Ports: []uint16{443}, CADir: filepath.Join(dir, "ca"),
						NoMITM: tt.noMITM, MITMExceptions: tt.exceptions},
					Ready: func(i Info) { ready <- i },
				})
			}()
			select {
			case <-ready:
				if tt.want != "" {
					t.Fatalf("started with rules on a tunnelled host")
				}
				cancel()
				if err := <-done; err != nil {
					t.Errorf("Run: %v", err)
				}
			case err := <-done:
				if tt.want == "" {
					t.Fatalf("Run: %v", err)
				}
				if !errors.Is(err, ErrAllowlist) || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), "drop the rules of api.example.org") {
					t.Fatalf("Run: %v, want %v naming %q and the fix", err, ErrAllowlist, tt.want)
				}
			}
		})
	}
}
