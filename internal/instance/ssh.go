package instance

import (
	"fmt"
	"os"

	"github.com/abox-dev/abox/internal/paths"
)

// SSHArgs returns the ssh arguments that log in to the instance with its own
// key, verifying the host key pinned at create (no trust on first use).
//
// The guest is hostile and runs the sshd at the other end, so nothing of the
// host's may travel down the connection, whatever the user's ssh_config
// says (options given on the command line win over it): no agent (the
// guest could sign with every key in it), no X11 (keystrokes and screens of
// the host's display), no port forwardings (a RemoteForward from a "Host *"
// block would give the guest a connection into a host service), no
// Kerberos credential delegation, no shared master connection, no proxy
// command and no local command. The guest may not add host keys to the
// pinned known_hosts either (UpdateHostKeys), and the system-wide
// known_hosts plays no part.
func SSHArgs(l paths.Layout, st State, command []string) ([]string, error) {
	args, err := SSHOptions(l, st)
	if err != nil {
		return nil, err
	}
	args = append(args, SSHDestination(st))
	if len(command) > 0 {
		args = append(args, "--")
		args = append(args, command...)
	}
	return args, nil
}

// SSHDestination is the user@address ssh, scp and sshfs log in to.
func SSHDestination(st State) string { return st.User + "@" + st.GuestIP.String() }

// SSHOptions returns the hardened options of SSHArgs without the
// destination, for the tools that take ssh options (scp, sshfs, a forward).
func SSHOptions(l paths.Layout, st State) ([]string, error) {
	f := l.Instance(st.Name)
	if _, err := os.Stat(f.SSHKey); err != nil {
		return nil, fmt.Errorf("instance %s has no ssh key: %w", st.Name, err)
	}
	return []string{
		"-i", f.SSHKey,
		"-o", "IdentitiesOnly=yes",
		"-o", "UserKnownHostsFile=" + f.KnownHosts,
		"-o", "StrictHostKeyChecking=yes",
		"-o", "PasswordAuthentication=no",
		"-o", "KbdInteractiveAuthentication=no",
		"-o", "GlobalKnownHostsFile=/dev/null",
		"-o", "UpdateHostKeys=no",
		"-o", "ForwardAgent=no",
		"-o", "IdentityAgent=none",
		"-o", "ForwardX11=no",
		"-o", "ForwardX11Trusted=no",
		"-o", "ClearAllForwardings=yes",
		"-o", "Tunnel=no",
		"-o", "GSSAPIAuthentication=no",
		"-o", "GSSAPIDelegateCredentials=no",
		"-o", "ControlMaster=no",
		"-o", "ControlPath=none",
		"-o", "ProxyCommand=none",
		"-o", "PermitLocalCommand=no",
		"-o", "ConnectTimeout=10",
		"-o", "LogLevel=ERROR",
	}, nil
}
