package instance

import (
	"fmt"
	"net/netip"
)

// The errors below carry the facts of a refusal and no advice: the CLI
// turns them into hints, in one place (internal/cli's hints.go), so no
// message says the fix twice.

// NameTakenError: an instance of that name exists.
type NameTakenError struct {
	Name string
	// Import is set when an import was refused (its fix is --name).
	Import bool
}

func (e *NameTakenError) Error() string { return "an instance of that name exists" }

// DomainTakenError: libvirt has a domain of the instance's name that abox
// has no state for (an interrupted create or import, or not abox's).
type DomainTakenError struct {
	Name, Domain string
	Import       bool
}

func (e *DomainTakenError) Error() string {
	return fmt.Sprintf("libvirt already has a domain %s not known to abox", e.Domain)
}

// BaseMissingError: the base image asked for is not installed.
type BaseMissingError struct{ Base string }

func (e *BaseMissingError) Error() string {
	return fmt.Sprintf("base image %q is not installed", e.Base)
}

// SubnetInUseError: the requested subnet overlaps one in use.
type SubnetInUseError struct{ Subnet, Overlaps netip.Prefix }

func (e *SubnetInUseError) Error() string {
	return fmt.Sprintf("subnet %s is in use (overlaps %s)", e.Subnet, e.Overlaps)
}

// BridgeTakenError: the bridge name derived from the instance's name is
// another instance's (By) or a host interface's (By empty).
type BridgeTakenError struct{ Name, Bridge, By string }

func (e *BridgeTakenError) Error() string {
	if e.By != "" {
		return fmt.Sprintf("bridge %s of %s is already used by instance %s", e.Bridge, e.Name, e.By)
	}
	return fmt.Sprintf("a host interface %s already exists", e.Bridge)
}
