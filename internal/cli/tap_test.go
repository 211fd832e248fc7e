package cli

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

// TestTapMaxSize: a pcap file is capped at a gigabyte unless --max-size
// says otherwise, and a cap that is negative or has no file is refused
// before anything runs.
func TestTapMaxSize(t *testing.T) {
	e := &env{stdout: &bytes.Buffer{}, stderr: &bytes.Buffer{}}
	if got := newTapCmd(e).Flags().Lookup("max-size").DefValue; got != "1000" {
		t.Errorf("--max-size defaults to %s, want 1000 (million bytes)", got)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"dev", "-o", "x.pcap", "--max-size", "-1"}, "--max-size -1"},
		{[]string{"dev", "-o", "x.pcap", "--max-size", "9223372036855"}, "--max-size 9223372036855"},
		{[]string{"dev", "--max-size", "10"}, "take -o FILE"},
		{[]string{"dev", "--ring", "3"}, "take -o FILE"},
		{[]string{"dev", "-o", "x.pcap", "--ring", "3", "--max-size", "0"}, "a --max-size above 0"},
		{[]string{"dev", "-o", "x.pcap", "--ring", "1"}, "a ring of 1 capture files"},
		{[]string{"dev", "-c", "-2"}, "packet count -2"},
	} {
		cmd := newTapCmd(e)
		cmd.SetArgs(tc.args)
		cmd.SilenceErrors, cmd.SilenceUsage = true, true
		err := cmd.Execute()
		var ue usageError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("abox tap %q: %v; want a usage error naming %q", tc.args, err, tc.want)
		}
	}
}
