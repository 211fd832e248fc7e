// Command tetragon-emitter stands in for Tetragon inside a test guest, where
// the real agent cannot be built (docs/monitor.md). It does real things
// (runs a command, reads a file, opens a TCP connection) and appends the
// events Tetragon would report for them to Tetragon's JSON export file, in
// Tetragon's export form (the api module's types through protojson with the
// proto field names). The guest's abox forwarder then carries them over the
// real virtio-serial channel. It also forges and floods, as a hostile guest
// would.
//
//	tetragon-emitter [--out FILE] exec -- CMD ARGS...
//	tetragon-emitter [--out FILE] read PATH
//	tetragon-emitter [--out FILE] connect HOST:PORT
//	tetragon-emitter [--out FILE] flood N
//	tetragon-emitter [--out FILE] hostile
package main

import (
	"bufio"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/cilium/tetragon/api/v1/tetragon"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/timestamppb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

func main() {
	out := flag.String("out", "/var/log/tetragon/tetragon.log", "Tetragon export file to append to")
	flag.Parse()
	args := flag.Args()
	if len(args) == 0 {
		fail("usage: tetragon-emitter [--out FILE] exec|read|connect|flood|hostile ...")
	}
	if err := os.MkdirAll(dirOf(*out), 0o755); err != nil {
		fail(err.Error())
	}
	f, err := os.OpenFile(*out, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		fail(err.Error())
	}
	w := bufio.NewWriter(f)
	defer func() { w.Flush(); f.Close() }()
	host, _ := os.Hostname()
	emit := func(r *tetragon.GetEventsResponse) {
		r.NodeName, r.Time = host, timestamppb.Now()
		b, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(r)
		if err != nil {
			fail(err.Error())
		}
		w.Write(b)
		w.WriteByte('\n')
	}
	switch args[0] {
	case "exec":
		cmdArgs := args[1:]
		if len(cmdArgs) > 0 && cmdArgs[0] == "--" {
			cmdArgs = cmdArgs[1:]
		}
		if len(cmdArgs) == 0 {
			fail("exec needs a command")
		}
		path, err := exec.LookPath(cmdArgs[0])
		if err != nil {
			fail(err.Error())
		}
		cmd := exec.Command(path, cmdArgs[1:]...)
		cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
		if err := cmd.Start(); err != nil {
			fail(err.Error())
		}
		p := self(path, strings.Join(cmdArgs[1:], " "), uint32(cmd.Process.Pid))
		parent := self(exe(), "", uint32(os.Getpid()))
		emit(&tetragon.GetEventsResponse{Event: &tetragon.GetEventsResponse_ProcessExec{ProcessExec: &tetragon.ProcessExec{Process: p, Parent: parent}}})
		err = cmd.Wait()
		status := uint32(0)
		if ee, ok := err.(*exec.ExitError); ok {
			status = uint32(ee.ExitCode())
		}
		emit(&tetragon.GetEventsResponse{Event: &tetragon.GetEventsResponse_ProcessExit{ProcessExit: &tetragon.ProcessExit{Process: p, Parent: parent, Status: status}}})
	case "read":
		if len(args) != 2 {
			fail("read needs a PATH")
		}
		if _, err := os.ReadFile(args[1]); err != nil {
			fail(err.Error())
		}
		emit(kprobe("security_file_permission", "abox-sensitive-files",
			&tetragon.KprobeArgument{Arg: &tetragon.KprobeArgument_FileArg{FileArg: &tetragon.KprobeFile{Path: args[1]}}},
			&tetragon.KprobeArgument{Arg: &tetragon.KprobeArgument_IntArg{IntArg: 4}}))
	case "connect":
		if len(args) != 2 {
			fail("connect needs HOST:PORT")
		}
		c, err := net.DialTimeout("tcp", args[1], 10*time.Second)
		if err != nil {
			fail(err.Error())
		}
		l, r := c.LocalAddr().(*net.TCPAddr), c.RemoteAddr().(*net.TCPAddr)
		c.Close()
		emit(kprobe("tcp_connect", "abox-network",
			&tetragon.KprobeArgument{Arg: &tetragon.KprobeArgument_SockArg{SockArg: &tetragon.KprobeSock{
				Family: "AF_INET", Type: "SOCK_STREAM", Protocol: "IPPROTO_TCP",
				Saddr: l.IP.String(), Sport: uint32(l.Port), Daddr: r.IP.String(), Dport: uint32(r.Port),
			}}}))
	case "flood":
		n, err := strconv.Atoi(arg(args, 1))
		if err != nil || n <= 0 {
			fail("flood needs a count")
		}
		for i := 0; i < n; i++ {
			emit(&tetragon.GetEventsResponse{Event: &tetragon.GetEventsResponse_ProcessExec{ProcessExec: &tetragon.ProcessExec{
				Process: self("/usr/bin/flood", strconv.Itoa(i), uint32(os.Getpid())),
			}}})
		}
	case "hostile":
		// Terminal escapes and bidi overrides in every string, an oversized
		// line, garbage, and a forged heartbeat.
		evil := "\x1b[2J\x1b]0;owned\x07\u009b31m\u202eevil"
		emit(&tetragon.GetEventsResponse{Event: &tetragon.GetEventsResponse_ProcessExec{ProcessExec: &tetragon.ProcessExec{
			Process: self("/usr/bin/"+evil, evil, 1),
		}}})
		w.WriteString(strings.Repeat("A", 200<<10) + "\n")
		w.WriteString("not json at all\n")
	default:
		fail("unknown command " + args[0])
	}
}

func kprobe(fn, policy string, a ...*tetragon.KprobeArgument) *tetragon.GetEventsResponse {
	return &tetragon.GetEventsResponse{Event: &tetragon.GetEventsResponse_ProcessKprobe{ProcessKprobe: &tetragon.ProcessKprobe{
		Process: self(exe(), strings.Join(os.Args[1:], " "), uint32(os.Getpid())), FunctionName: fn, PolicyName: policy, Args: a,
		Action: tetragon.KprobeAction_KPROBE_ACTION_POST,
	}}}
}

func self(binary, args string, pid uint32) *tetragon.Process {
	wd, _ := os.Getwd()
	return &tetragon.Process{Binary: binary, Arguments: args, Pid: wrapperspb.UInt32(pid), Uid: wrapperspb.UInt32(uint32(syscall.Getuid())), Cwd: wd}
}

func exe() string {
	p, err := os.Executable()
	if err != nil {
		return os.Args[0]
	}
	return p
}

func arg(a []string, i int) string {
	if i < len(a) {
		return a[i]
	}
	return ""
}

func dirOf(p string) string {
	if i := strings.LastIndexByte(p, '/'); i > 0 {
		return p[:i]
	}
	return "."
}

func fail(msg string) {
	fmt.Fprintln(os.Stderr, "tetragon-emitter:", msg)
	os.Exit(1)
}
