package daemon

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"

	"github.com/abox-dev/abox/internal/dnsfilter"
)

// EnvSockets tells a child which inherited file descriptors are which
// socket: "dns-udp,dns-tcp,http" names fds 3, 4 and 5 in that order
// ("capture-http" and "capture-tls" may follow).
const EnvSockets = "ABOX_SOCKETS"

// Sockets are the data plane's listening sockets, bound once by the
// supervisor and handed to every filter process it starts, so the addresses
// stay held (and no other local process can take them) while a filter
// process restarts.
type Sockets struct {
	DNSPacket net.PacketConn
	DNSStream net.Listener
	HTTP      net.Listener
	// CaptureHTTP and CaptureTLS receive the guest's connections to ports
	// 80 and 443 of other addresses, which the host redirects to them
	// (hostfw's capture rule); nil when not bound.
	CaptureHTTP, CaptureTLS net.Listener
}

// BindSockets binds the DNS filter's UDP and TCP sockets on dnsAddr and the
// proxy's on httpAddr (either may be empty for none).
func BindSockets(dnsAddr, httpAddr string) (*Sockets, error) {
	s := &Sockets{}
	if dnsAddr != "" {
		pc, ln, err := dnsfilter.Listen(dnsAddr)
		if err != nil {
			return nil, err
		}
		s.DNSPacket, s.DNSStream = pc, ln
	}
	if httpAddr != "" {
		ln, err := net.Listen("tcp", httpAddr)
		if err != nil {
			s.Close()
			return nil, fmt.Errorf("proxy: %w", err)
		}
		s.HTTP = ln
	}
	return s, nil
}

// BindCapture binds the capture listeners on httpAddr (for port 80) and
// tlsAddr (for port 443); on a failure neither stays bound.
func (s *Sockets) BindCapture(httpAddr, tlsAddr string) error {
	h, err := net.Listen("tcp", httpAddr)
	if err != nil {
		return fmt.Errorf("capture of port 80: %w", err)
	}
	t, err := net.Listen("tcp", tlsAddr)
	if err != nil {
		h.Close()
		return fmt.Errorf("capture of port 443: %w", err)
	}
	s.CaptureHTTP, s.CaptureTLS = h, t
	return nil
}

// Close closes the sockets held.
func (s *Sockets) Close() {
	if s.DNSPacket != nil {
		s.DNSPacket.Close()
	}
	if s.DNSStream != nil {
		s.DNSStream.Close()
	}
	if s.HTTP != nil {
		s.HTTP.Close()
	}
	if s.CaptureHTTP != nil {
		s.CaptureHTTP.Close()
	}
	if s.CaptureTLS != nil {
		s.CaptureTLS.Close()
	}
}

type filer interface{ File() (*os.File, error) }

// Files returns duplicates of the sockets for exec.Cmd.ExtraFiles and the
// environment entry that names them; the caller closes the files once the
// child has started.
func (s *Sockets) Files() ([]*os.File, string, error) {
	var files []*os.File
	var names []string
	add := func(name string, c any) error {
		if c == nil {
			return nil
		}
		f, err := c.(filer).File()
		if err != nil {
			return fmt.Errorf("handing over the %s socket: %w", name, err)
		}
		files = append(files, f)
		names = append(names, name)
		return nil
	}
	var err error
	if s.DNSPacket != nil {
		err = errors.Join(err, add("dns-udp", s.DNSPacket))
	}
	if s.DNSStream != nil {
		err = errors.Join(err, add("dns-tcp", s.DNSStream))
	}
	if s.HTTP != nil {
		err = errors.Join(err, add("http", s.HTTP))
	}
	if s.CaptureHTTP != nil {
		err = errors.Join(err, add("capture-http", s.CaptureHTTP))
	}
	if s.CaptureTLS != nil {
		err = errors.Join(err, add("capture-tls", s.CaptureTLS))
	}
	if err != nil {
		for _, f := range files {
			f.Close()
		}
		return nil, "", err
	}
	return files, EnvSockets + "=" + strings.Join(names, ","), nil
}

// InheritedSockets returns the sockets a supervisor handed to this process
// (EnvSockets), or nil when there are none.
func InheritedSockets() (*Sockets, error) {
	v := os.Getenv(EnvSockets)
	if v == "" {
		return nil, nil
	}
	os.Unsetenv(EnvSockets)
	s := &Sockets{}
	for i, name := range strings.Split(v, ",") {
		fd := uintptr(3 + i)
		f := os.NewFile(fd, name)
		if f == nil {
			s.Close()
			return nil, fmt.Errorf("inherited socket %s: fd %d is not open", name, fd)
		}
		var err error
		switch name {
		case "dns-udp":
			s.DNSPacket, err = net.FilePacketConn(f)
		case "dns-tcp":
			s.DNSStream, err = net.FileListener(f)
		case "http":
			s.HTTP, err = net.FileListener(f)
		case "capture-http":
			s.CaptureHTTP, err = net.FileListener(f)
		case "capture-tls":
			s.CaptureTLS, err = net.FileListener(f)
		default:
			err = fmt.Errorf("unknown socket name (%s=%s)", EnvSockets, v)
		}
		f.Close() // net.File* dup the descriptor
		if err != nil {
			s.Close()
			return nil, fmt.Errorf("inherited socket %s (fd %s): %w", name, strconv.Itoa(int(fd)), err)
		}
	}
	return s, nil
}
