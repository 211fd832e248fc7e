package cli

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/abox-dev/abox/internal/instance"
	"github.com/abox-dev/abox/internal/steps"
)

// Every typed refusal of instance gets its fix as a hint, and only as a
// hint: the error's own message does not carry it.
func TestFactHints(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want string
	}{
		{"name taken at create", &instance.NameTakenError{Name: "dev"}, "abox remove dev"},
		{"name taken at import", &instance.NameTakenError{Name: "dev", Import: true}, "--name NEW"},
		{"domain taken at create", &instance.DomainTakenError{Name: "dev", Domain: "abox-dev"}, "virsh undefine abox-dev"},
		{"domain taken at import", &instance.DomainTakenError{Name: "dev2", Domain: "abox-dev2", Import: true}, "abox remove --force dev2"},
		{"base missing", &instance.BaseMissingError{Base: "alpine"}, "abox base import alpine FILE"},
		{"base missing names the builder", &instance.BaseMissingError{Base: "alpine"}, "abox base build"},
		{"subnet in use", &instance.SubnetInUseError{Subnet: netip.MustParsePrefix("10.10.0.0/24"), Overlaps: netip.MustParsePrefix("10.10.0.0/16")}, "leave --subnet out"},
		{"bridge of another instance", &instance.BridgeTakenError{Name: "dev", Bridge: "abox-dev", By: "other"}, "rename one of them"},
		{"bridge of the host", &instance.BridgeTakenError{Name: "dev", Bridge: "abox-dev"}, "ip link del abox-dev"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			wrapped := fmt.Errorf("creating dev: %w", tt.err)
			if got := factHint(wrapped); !strings.Contains(got, tt.want) {
				t.Errorf("factHint(%v) = %q, want it to contain %q", wrapped, got, tt.want)
			}
			if strings.Contains(tt.err.Error(), tt.want) {
				t.Errorf("the error %q itself says the fix %q; it belongs in the hint alone", tt.err, tt.want)
			}
		})
	}
	if h := factHint(fmt.Errorf("something else")); h != "" {
		t.Errorf("factHint of an untyped error = %q, want none", h)
	}
}

// Main prints the hint of a typed error once, under the error.
func TestMainPrintsFactHintOnce(t *testing.T) {
	var out bytes.Buffer
	err := fmt.Errorf("creating dev: %w", &instance.BaseMissingError{Base: "nope"})
	printHints(&out, err)
	if got := out.String(); strings.Count(got, "abox base build") != 1 || !strings.Contains(got, "hint: ") {
		t.Errorf("printed %q, want one hint naming abox base build", got)
	}
}

// The step printer shows each step's end with its duration, failures
// with their error, and nothing for a step that only began.
func TestStepPrinter(t *testing.T) {
	var out bytes.Buffer
	p := stepPrinter(&out)
	p(steps.Event{Step: "disk overlay", Index: 0, Total: 3, Phase: steps.Started})
	p(steps.Event{Step: "disk overlay", Index: 0, Total: 3, Phase: steps.Done, Elapsed: 1500 * time.Millisecond})
	p(steps.Event{Step: "cloud-init seed", Index: 1, Total: 3, Phase: steps.Failed, Elapsed: time.Second, Err: errors.New("genisoimage: exit 1")})
	p(steps.Event{Step: "disk overlay", Index: 0, Total: 3, Phase: steps.Undone, Elapsed: 2 * time.Millisecond})
	want := "step 1/3 disk overlay: done in 1.5s\n" +
		"step 2/3 cloud-init seed: failed after 1s: genisoimage: exit 1\n" +
		"step 1/3 disk overlay: undone in 2ms\n"
	if out.String() != want {
		t.Errorf("printed:\n%s\nwant:\n%s", out.String(), want)
	}
}
