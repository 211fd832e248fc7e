// Package monitor is the host side of abox's runtime monitor: it reads the
// Tetragon events a guest forwards over a virtio-serial channel, treats
// every byte as hostile (bounded lines, bounded rate, untrusted fields),
// normalises each event to one JSON line in the instance's logs, and keeps
// counters and the guest forwarder's heartbeat.
package monitor

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/cilium/tetragon/api/v1/tetragon"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/abox-dev/abox/internal/termtext"
)

// Event types of a normalised event.
const (
	TypeExec  = "exec"
	TypeExit  = "exit"
	TypeFile  = "file"
	TypeNet   = "net"
	TypeOther = "other"
)

// Types are the types `abox monitor logs --type` accepts.
var Types = []string{TypeExec, TypeExit, TypeFile, TypeNet, TypeOther}

// Field bounds: the guest chooses every string, so none is unbounded.
const (
	maxField = 1024
	maxArgs  = 4096
)

// Proc is a process as the guest reported it.
type Proc struct {
	Binary string `json:"binary,omitempty"`
	Args   string `json:"args,omitempty"`
	Cwd    string `json:"cwd,omitempty"`
	PID    uint32 `json:"pid,omitempty"`
	// UID is nil when the guest did not say.
	UID *uint32 `json:"uid,omitempty"`
}

// Event is one normalised monitor event: one JSON line in logs/monitor.log.
// Every string in it came from the guest and has been through clean: valid
// UTF-8, no control characters, bounded length.
type Event struct {
	// Received is the host's time; Time is what the guest claims.
	Received time.Time `json:"received"`
	Time     time.Time `json:"time,omitzero"`
	Type     string    `json:"type"`
	// Kind is Tetragon's event kind (process_exec, process_kprobe, ...).
	Kind    string `json:"kind"`
	Node    string `json:"node,omitempty"`
	Process *Proc  `json:"process,omitempty"`
	Parent  *Proc  `json:"parent,omitempty"`
	// Function and Policy name the hook of a kprobe/LSM event.
	Function string `json:"function,omitempty"`
	Policy   string `json:"policy,omitempty"`
	Action   string `json:"action,omitempty"`
	// File events.
	Path string `json:"path,omitempty"`
	Op   string `json:"op,omitempty"`
	// Net events.
	Proto string `json:"proto,omitempty"`
	Src   string `json:"src,omitempty"`
	Dst   string `json:"dst,omitempty"`
	Port  uint32 `json:"port,omitempty"`
	// Exit events.
	Status *uint32 `json:"status,omitempty"`
	Signal string  `json:"signal,omitempty"`
}

// Heartbeat is the forwarder's own line, sent every few seconds:
// {"abox_heartbeat":{"seq":N,"agent":"tetragon","agent_up":true}}.
type Heartbeat struct {
	Seq   uint64 `json:"seq"`
	Agent string `json:"agent"`
	// AgentUp says whether the forwarder sees the agent running.
	AgentUp bool `json:"agent_up"`
}

var errNotEvent = errors.New("not a Tetragon event")

// Parse reads one line: a forwarder heartbeat, or a Tetragon event in its
// JSON export form (GetEventsResponse, protojson), normalised.
func Parse(line []byte, received time.Time) (*Event, *Heartbeat, error) {
	var probe struct {
		Heartbeat *Heartbeat `json:"abox_heartbeat"`
	}
	if json.Unmarshal(line, &probe) == nil && probe.Heartbeat != nil {
		hb := *probe.Heartbeat
		hb.Agent = clean(hb.Agent, 64)
		return nil, &hb, nil
	}
	var r tetragon.GetEventsResponse
	if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(line, &r); err != nil {
		return nil, nil, fmt.Errorf("%w: %v", errNotEvent, err)
	}
	ev := normalise(&r)
	if ev == nil {
		return nil, nil, errNotEvent
	}
	ev.Received = received.UTC()
	return ev, nil, nil
}

func normalise(r *tetragon.GetEventsResponse) *Event {
	ev := &Event{Node: clean(r.GetNodeName(), maxField)}
	if t := r.GetTime(); t != nil && t.IsValid() {
		ev.Time = t.AsTime().UTC()
	}
	switch e := r.GetEvent().(type) {
	case *tetragon.GetEventsResponse_ProcessExec:
		ev.Type, ev.Kind = TypeExec, "process_exec"
		ev.Process, ev.Parent = proc(e.ProcessExec.GetProcess()), proc(e.ProcessExec.GetParent())
	case *tetragon.GetEventsResponse_ProcessExit:
		ev.Type, ev.Kind = TypeExit, "process_exit"
		ev.Process, ev.Parent = proc(e.ProcessExit.GetProcess()), proc(e.ProcessExit.GetParent())
		st := e.ProcessExit.GetStatus()
		ev.Status = &st
		ev.Signal = clean(e.ProcessExit.GetSignal(), 32)
	case *tetragon.GetEventsResponse_ProcessKprobe:
		k := e.ProcessKprobe
		ev.Kind = "process_kprobe"
		ev.Process, ev.Parent = proc(k.GetProcess()), proc(k.GetParent())
		ev.Function, ev.Policy = clean(k.GetFunctionName(), 128), clean(k.GetPolicyName(), 128)
		ev.Action = strings.ToLower(strings.TrimPrefix(k.GetAction().String(), "KPROBE_ACTION_"))
		hook(ev, k.GetArgs())
	case *tetragon.GetEventsResponse_ProcessLsm:
		l := e.ProcessLsm
		ev.Kind = "process_lsm"
		ev.Process, ev.Parent = proc(l.GetProcess()), proc(l.GetParent())
		ev.Function, ev.Policy = clean(l.GetFunctionName(), 128), clean(l.GetPolicyName(), 128)
		ev.Action = strings.ToLower(strings.TrimPrefix(l.GetAction().String(), "KPROBE_ACTION_"))
		hook(ev, l.GetArgs())
	case *tetragon.GetEventsResponse_ProcessTracepoint:
		ev.Type, ev.Kind = TypeOther, "process_tracepoint"
		ev.Process = proc(e.ProcessTracepoint.GetProcess())
		ev.Function = clean(e.ProcessTracepoint.GetSubsys()+"/"+e.ProcessTracepoint.GetEvent(), 128)
	case nil:
		return nil
	default:
		ev.Type, ev.Kind = TypeOther, "other"
	}
	return ev
}

// hook classifies a kprobe or LSM event by its arguments: a socket makes it
// a network event, a file or path a file event.
func hook(ev *Event, args []*tetragon.KprobeArgument) {
	ev.Type = TypeOther
	var mask int32 = -1
	for _, a := range args {
		switch {
		case a.GetSockArg() != nil:
			s := a.GetSockArg()
			ev.Type = TypeNet
			ev.Proto = clean(strings.ToLower(strings.TrimPrefix(s.GetProtocol(), "IPPROTO_")), 16)
			ev.Src = clean(s.GetSaddr(), 64)
			ev.Dst = clean(s.GetDaddr(), 64)
			ev.Port = s.GetDport()
		case a.GetSockaddrArg() != nil:
			s := a.GetSockaddrArg()
			ev.Type = TypeNet
			ev.Dst, ev.Port = clean(s.GetAddr(), 64), s.GetPort()
		case a.GetFileArg() != nil:
			ev.Type = TypeFile
			ev.Path = clean(a.GetFileArg().GetPath(), maxField)
		case a.GetPathArg() != nil:
			ev.Type = TypeFile
			ev.Path = clean(a.GetPathArg().GetPath(), maxField)
		case a.GetLinuxBinprmArg() != nil:
			ev.Type = TypeFile
			ev.Path = clean(a.GetLinuxBinprmArg().GetPath(), maxField)
		}
		if _, ok := a.GetArg().(*tetragon.KprobeArgument_IntArg); ok {
			mask = a.GetIntArg()
		}
	}
	if ev.Type == TypeFile {
		ev.Op = fileOp(ev.Function, mask)
	}
	if ev.Type == TypeNet && ev.Proto == "" {
		switch {
		case strings.HasPrefix(ev.Function, "tcp_"):
			ev.Proto = "tcp"
		case strings.HasPrefix(ev.Function, "udp_"):
			ev.Proto = "udp"
		}
	}
}

// fileOp names what a file hook did. security_file_permission's mask is
// MAY_WRITE (2) or MAY_READ (4), as in Tetragon's file-monitoring policies.
func fileOp(fn string, mask int32) string {
	switch fn {
	case "security_file_permission", "security_mmap_file":
		switch {
		case mask&2 != 0:
			return "write"
		case mask&4 != 0:
			return "read"
		}
		return "access"
	case "security_file_open", "fd_install", "security_file_open_post":
		return "open"
	case "security_path_unlink", "security_inode_unlink":
		return "unlink"
	case "security_path_truncate":
		return "truncate"
	case "security_path_rename", "security_inode_rename":
		return "rename"
	case "security_path_chmod":
		return "chmod"
	case "security_bprm_check", "security_bprm_creds_for_exec":
		return "exec"
	}
	return fn
}

func proc(p *tetragon.Process) *Proc {
	if p == nil {
		return nil
	}
	out := &Proc{
		Binary: clean(p.GetBinary(), maxField),
		Args:   clean(p.GetArguments(), maxArgs),
		Cwd:    clean(p.GetCwd(), maxField),
	}
	if v := p.GetPid(); v != nil {
		out.PID = v.GetValue()
	}
	if v := p.GetUid(); v != nil {
		u := v.GetValue()
		out.UID = &u
	}
	return out
}

// clean makes a guest-chosen string safe to store and to print: invalid
// UTF-8 and every rune termtext holds unsafe for a terminal (C0, DEL, C1
// such as the 8-bit CSI, the line and paragraph separators, and the
// bidirectional overrides that reorder what a terminal shows) become
// U+FFFD, and the result is cut to max bytes on a rune boundary.
func clean(s string, max int) string {
	if len(s) > 4*max {
		s = s[:4*max]
	}
	var b strings.Builder
	for i, w := 0, 0; i < len(s); i += w {
		r, size := utf8.DecodeRuneInString(s[i:])
		w = size
		if r == utf8.RuneError && size <= 1 || termtext.Unsafe(r) {
			r = utf8.RuneError
		}
		if b.Len()+utf8.RuneLen(r) > max {
			break
		}
		b.WriteRune(r)
	}
	return b.String()
}

// Printable is s made safe for a terminal, as every stored field already is;
// the renderer applies it again so that no log line, however it was
// written, can move the cursor or retitle the operator's terminal.
func Printable(s string) string { return clean(s, maxArgs) }
