package guest

import (
	"errors"
	"fmt"
	"strings"

	"github.com/abox-dev/abox/internal/instance"
	"github.com/abox-dev/abox/internal/validate"
)

// Location is one side of a copy: a host path, or a path in an instance.
type Location struct {
	// Instance is empty for a host path.
	Instance string
	// Path is the host path, or the guest path (relative to the login
	// user's home; empty means the home itself).
	Path string
}

// ParseLocation reads NAME:PATH (a guest path) or a host path. A host path
// that contains a colon can be written ./a:b or as an absolute path.
func ParseLocation(s string) (Location, error) {
	if s == "" {
		return Location{}, errors.New("empty path")
	}
	if strings.HasPrefix(s, "/") || strings.HasPrefix(s, ".") {
		return Location{Path: s}, nil
	}
	name, path, ok := strings.Cut(s, ":")
	if !ok || strings.Contains(name, "/") {
		return Location{Path: s}, nil
	}
	if err := validate.InstanceName(name); err != nil {
		return Location{}, fmt.Errorf("%q: %w (write a host path with a colon as ./%s)", s, err, s)
	}
	return Location{Instance: name, Path: path}, nil
}

// CopyPlan is an scp between the host and one instance.
type CopyPlan struct {
	Sources   []Location
	Dest      Location
	Recursive bool
}

// Instance returns the one instance the plan touches, or an error when it
// names none, several, or copies guest to guest.
func (p CopyPlan) Instance() (string, error) {
	if len(p.Sources) == 0 {
		return "", errors.New("copying: no source")
	}
	name := ""
	remoteSrc := false
	for _, s := range p.Sources {
		if s.Instance == "" {
			continue
		}
		remoteSrc = true
		if name != "" && s.Instance != name {
			return "", fmt.Errorf("copying: sources in two instances (%s, %s); copy one instance at a time", name, s.Instance)
		}
		name = s.Instance
	}
	if p.Dest.Instance != "" {
		if remoteSrc {
			return "", errors.New("copying: both sides are in an instance; one side must be a host path")
		}
		name = p.Dest.Instance
	} else if !remoteSrc {
		return "", errors.New("copying: neither side names an instance (write NAME:PATH on one side)")
	}
	for _, s := range p.Sources {
		if (s.Instance == "") == (p.Dest.Instance == "") {
			return "", errors.New("copying: mix of host and guest sources; all sources must be on the other side of the destination")
		}
	}
	return name, nil
}

// scpArgs builds scp's argument list for the plan against t.
func scpArgs(t Target, p CopyPlan) ([]string, error) {
	opts, err := instance.SSHOptions(t.Layout, t.State)
	if err != nil {
		return nil, err
	}
	// -F /dev/null: no ssh_config of the user's (a RemoteForward there
	// would survive in scp, which has no ClearAllForwardings of its own on
	// every version), -q: no progress meter noise in scripts, -s: SFTP
	// whatever the scp version (in the legacy protocol the guest's end
	// names the files and modes it sends, set-uid bits included; an scp
	// too old for -s fails instead).
	args := append([]string{"-F", "/dev/null", "-q", "-s"}, opts...)
	if p.Recursive {
		args = append(args, "-r")
	}
	args = append(args, "--")
	dest := instance.SSHDestination(t.State)
	side := func(l Location) string {
		if l.Instance == "" {
			return l.Path
		}
		return dest + ":" + l.Path
	}
	for _, s := range p.Sources {
		args = append(args, side(s))
	}
	return append(args, side(p.Dest)), nil
}
