package monitor

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/tetragon/api/v1/tetragon"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/timestamppb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/abox-dev/abox/internal/termtext"
)

// export renders an event the way Tetragon's JSON export does (protojson
// with the proto field names).
func export(t testing.TB, r *tetragon.GetEventsResponse) []byte {
	t.Helper()
	b, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	return append(b, '\n')
}

func execEvent(binary, args string, uid uint32) *tetragon.GetEventsResponse {
	return &tetragon.GetEventsResponse{
		NodeName: "obs",
		Time:     timestamppb.New(time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)),
		Event: &tetragon.GetEventsResponse_ProcessExec{ProcessExec: &tetragon.ProcessExec{
			Process: &tetragon.Process{Binary: binary, Arguments: args, Uid: wrapperspb.UInt32(uid), Pid: wrapperspb.UInt32(4242), Cwd: "/home/abox"},
			Parent:  &tetragon.Process{Binary: "/usr/bin/bash", Pid: wrapperspb.UInt32(1)},
		}},
	}
}

func fileEvent(path string, mask int32) *tetragon.GetEventsResponse {
	return &tetragon.GetEventsResponse{Event: &tetragon.GetEventsResponse_ProcessKprobe{ProcessKprobe: &tetragon.ProcessKprobe{
		Process:      &tetragon.Process{Binary: "/usr/bin/cat", Uid: wrapperspb.UInt32(1000)},
		FunctionName: "security_file_permission",
		PolicyName:   "abox-sensitive-files",
		Args: []*tetragon.KprobeArgument{
			{Arg: &tetragon.KprobeArgument_FileArg{FileArg: &tetragon.KprobeFile{Path: path}}},
			{Arg: &tetragon.KprobeArgument_IntArg{IntArg: mask}},
		},
		Action: tetragon.KprobeAction_KPROBE_ACTION_POST,
	}}}
}

func netEvent(dst string, port uint32) *tetragon.GetEventsResponse {
	return &tetragon.GetEventsResponse{Event: &tetragon.GetEventsResponse_ProcessKprobe{ProcessKprobe: &tetragon.ProcessKprobe{
		Process:      &tetragon.Process{Binary: "/usr/bin/curl"},
		FunctionName: "tcp_connect",
		Args: []*tetragon.KprobeArgument{{Arg: &tetragon.KprobeArgument_SockArg{SockArg: &tetragon.KprobeSock{
			Family: "AF_INET", Type: "SOCK_STREAM", Protocol: "IPPROTO_TCP", Saddr: "10.10.0.10", Daddr: dst, Sport: 40000, Dport: port,
		}}}},
	}}}
}

func TestParseTetragonExport(t *testing.T) {
	now := time.Now()
	ev, _, err := Parse(export(t, execEvent("/usr/bin/curl", "-s https://example.com", 1000)), now)
	if err != nil {
		t.Fatal(err)
	}
	if ev.Type != TypeExec || ev.Process.Binary != "/usr/bin/curl" || ev.Process.Args != "-s https://example.com" || *ev.Process.UID != 1000 || ev.Parent.Binary != "/usr/bin/bash" || ev.Node != "obs" || ev.Time.IsZero() {
		t.Errorf("exec = %+v / %+v", ev, ev.Process)
	}
	ev, _, err = Parse(export(t, fileEvent("/etc/shadow", 4)), now)
	if err != nil || ev.Type != TypeFile || ev.Path != "/etc/shadow" || ev.Op != "read" || ev.Policy != "abox-sensitive-files" || ev.Action != "post" {
		t.Errorf("file = %+v, %v", ev, err)
	}
	ev, _, err = Parse(export(t, netEvent("93.184.216.34", 443)), now)
	if err != nil || ev.Type != TypeNet || ev.Dst != "93.184.216.34" || ev.Port != 443 || ev.Proto != "tcp" {
		t.Errorf("net = %+v, %v", ev, err)
	}
	// camelCase protojson is Tetragon's gRPC JSON form: accepted too.
	b, _ := protojson.Marshal(execEvent("/bin/true", "", 0))
	if ev, _, err := Parse(b, now); err != nil || ev.Process.Binary != "/bin/true" || *ev.Process.UID != 0 {
		t.Errorf("camelCase = %+v, %v", ev, err)
	}
	_, hb, err := Parse([]byte(`{"abox_heartbeat":{"seq":3,"agent":"tetragon","agent_up":true}}`), now)
	if err != nil || hb == nil || hb.Seq != 3 || !hb.AgentUp {
		t.Errorf("heartbeat = %+v, %v", hb, err)
	}
	for _, bad := range []string{`not json`, `{}`, `{"process_exec":"x"}`, `[1,2]`, `{"unknown_kind":{}}`} {
		if _, _, err := Parse([]byte(bad), now); err == nil {
			t.Errorf("Parse(%q) accepted", bad)
		}
	}
}

// TestUntrustedFields: whatever the guest puts in a string, the stored line
// holds nothing termtext holds unsafe for a terminal (no control
// character, no line or paragraph separator, no bidi override) and no
// invalid UTF-8, and stays bounded.
func TestUntrustedFields(t *testing.T) {
	hostile := "a\x1b[2J\x1b]0;pwned\x07b\u009b31mc\r\n\u202eevil\u2028line\u2029para" + strings.Repeat("x", 100000)
	ev, _, err := Parse(export(t, execEvent(hostile, hostile, 0)), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(ev)
	var back Event
	json.Unmarshal(b, &back)
	for _, s := range []string{back.Process.Binary, back.Process.Args} {
		for _, r := range s {
			if termtext.Unsafe(r) {
				t.Fatalf("control character %U survived in %q", r, s[:40])
			}
		}
		if !strings.HasPrefix(s, "a\ufffd[2J") {
			t.Errorf("cleaned = %q", s[:20])
		}
	}
	if len(back.Process.Binary) > maxField || len(back.Process.Args) > maxArgs {
		t.Errorf("fields not bounded: %d, %d", len(back.Process.Binary), len(back.Process.Args))
	}
}

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) { s.mu.Lock(); defer s.mu.Unlock(); return s.b.Write(p) }
func (s *syncBuf) String() string              { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

func TestReadBoundsLinesAndRate(t *testing.T) {
	var out syncBuf
	clock := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	m, err := New(Config{Dial: func(context.Context) (io.ReadCloser, error) { return nil, io.EOF }, Events: &out, MaxLine: 4096, Rate: 10, Burst: 20, Now: func() time.Time { return clock }})
	if err != nil {
		t.Fatal(err)
	}
	var in bytes.Buffer
	in.Write(export(t, execEvent("/bin/ok", "", 0)))
	in.WriteString(strings.Repeat("A", 100000) + "\n") // oversized: dropped whole
	in.Write(export(t, netEvent("1.2.3.4", 80)))       // the next line still parses
	in.WriteString("garbage\n")
	for i := 0; i < 1000; i++ { // a flood at one instant: the burst passes, the rest is dropped
		in.Write(export(t, execEvent("/bin/flood", "", 0)))
	}
	if err := m.Read(&in); err != nil {
		t.Fatal(err)
	}
	st := m.Status()
	if st.DroppedOversize != 1 || st.DroppedInvalid != 1 {
		t.Errorf("oversize %d invalid %d, want 1 and 1", st.DroppedOversize, st.DroppedInvalid)
	}
	// 20 burst tokens: the exec, the net event, the garbage line and 17 floods.
	if st.Events != 19 || st.DroppedRate != 1000-17 {
		t.Errorf("events %d dropped by rate %d", st.Events, st.DroppedRate)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != int(st.Events) {
		t.Errorf("%d lines written for %d events", len(lines), st.Events)
	}
	if st.ByType[TypeExec] != 18 || st.ByType[TypeNet] != 1 {
		t.Errorf("by type %v", st.ByType)
	}
	if st.Bytes < 100000 {
		t.Errorf("bytes %d do not count the oversized line", st.Bytes)
	}
}

// TestRunReconnectsAndWritesStatus serves the channel on a real unix socket
// (as QEMU does for a virtio-serial port), closes it, serves again, and
// checks events, heartbeat, status file and silence detection.
func TestRunReconnectsAndWritesStatus(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "monitor.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var out syncBuf
	statusPath := filepath.Join(dir, "monitor.json")
	m, err := New(Config{
		Instance: "obs", Events: &out, StatusPath: statusPath, SilentAfter: 2 * time.Second,
		Dial: func(ctx context.Context) (io.ReadCloser, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	for round := 0; round < 2; round++ {
		c, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		w := bufio.NewWriter(c)
		w.WriteString(`{"abox_heartbeat":{"seq":1,"agent":"emitter","agent_up":true}}` + "\n")
		w.Write(export(t, fileEvent("/home/abox/.ssh/id_ed25519", 4)))
		w.Flush()
		time.Sleep(200 * time.Millisecond)
		c.Close() // the guest went away; the monitor must come back
	}
	deadline := time.Now().Add(5 * time.Second)
	for m.Status().Events < 2 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	// The status file is written on a one-second tick: wait for a tick
	// that carries both events, with room for a loaded machine.
	var st Status
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		var err error
		st, err = ReadStatus(statusPath)
		if err == nil && st.Events >= 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("status file after 10s: %+v, %v", st, err)
		}
	}
	if st.Events != 2 || st.Agent != "emitter" || !st.AgentUp || st.LastHeartbeat.IsZero() || st.Instance != "obs" {
		t.Errorf("status = %+v", st)
	}
	if silent, _ := st.Silent(st.LastHeartbeat.Add(time.Second)); silent {
		t.Error("silent one second after a heartbeat")
	}
	if silent, since := st.Silent(st.LastHeartbeat.Add(3 * time.Second)); !silent || !since.Equal(st.LastHeartbeat) {
		t.Errorf("not silent 3s after the last heartbeat (%v %v)", silent, since)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), `"path":"/home/abox/.ssh/id_ed25519"`) {
		t.Errorf("event log = %s", out.String())
	}
}
