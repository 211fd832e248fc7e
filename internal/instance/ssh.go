package instance

import (
	"fmt"
	"os"

	"github.com/abox-dev/abox/internal/paths"
)

// SSHArgs returns the ssh arguments that log in to the instance with its own
// key, verifying the host key pinned at create (no trust on first use).
func SSHArgs(l paths.Layout, st State, command []string) ([]string, error) {
	f := FilesOf(l, st.Name)
	if _, err := os.Stat(f.SSHKey); err != nil {
		return nil, fmt.Errorf("instance %s has no ssh key: %w", st.Name, err)
	}
	args := []string{
		"-i", f.SSHKey,
		"-o", "IdentitiesOnly=yes",
		"-o", "UserKnownHostsFile=" + f.KnownHosts,
		"-o", "StrictHostKeyChecking=yes",
		"-o", "PasswordAuthentication=no",
		"-o", "KbdInteractiveAuthentication=no",
		"-o", "ConnectTimeout=10",
		"-o", "LogLevel=ERROR",
		st.User + "@" + st.GuestIP.String(),
	}
	if len(command) > 0 {
		args = append(args, "--")
		args = append(args, command...)
	}
	return args, nil
}
