package cli

import (
	"errors"
	"strings"
	"testing"

	"github.com/abox-dev/abox/internal/paths"
)

// TestArchiveCommandsValidateFirst: bad names and missing arguments are
// usage errors, found before libvirt is dialled.
func TestArchiveCommandsValidateFirst(t *testing.T) {
	l := paths.Layout{Root: t.TempDir()}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"export", "../etc"}, "instance name"},
		{[]string{"export"}, "NAME"},
		{[]string{"import"}, "FILE"},
		{[]string{"import", "dev.abox", "--name", "a/b"}, "--name"},
	} {
		out, err := runCLI(l, c.args...)
		var ue usageError
		if !errors.As(err, &ue) || !strings.Contains(err.Error()+out, c.want) {
			t.Errorf("abox %v = %v (%q), want a usage error naming %q", c.args, err, out, c.want)
		}
	}
}
