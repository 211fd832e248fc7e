package cloudinit

// The runtime monitor's guest side: a forwarder that follows Tetragon's JSON
// export file and writes each event, and a heartbeat every few seconds, to
// the monitor's virtio-serial port. It is Python because every cloud-init
// guest has python3; it parses nothing (the host treats every byte as
// hostile anyway) and only keeps lines whole and bounded.

// MonitorPort is the guest device of the channel (libvirt.MonitorChannel).
const MonitorPort = "/dev/virtio-ports/org.abox.monitor.0"

// MonitorExport is where the forwarder reads events: the file Tetragon
// writes with --export-filename (the path of upstream's packaged config).
const MonitorExport = "/var/log/tetragon/tetragon.log"

// MonitorForwarderPath and MonitorUnit are where the forwarder is installed.
const (
	MonitorForwarderPath = "/usr/local/lib/abox/monitor-forwarder.py"
	MonitorUnit          = "abox-monitor-forwarder.service"
)

const monitorForwarder = `#!/usr/bin/python3
# abox monitor forwarder (written by abox): streams Tetragon's JSON export to
# the host over virtio-serial, one event per line, with a heartbeat.
import json, os, time

PORT = os.environ.get("ABOX_MONITOR_PORT", "` + MonitorPort + `")
EXPORT = os.environ.get("ABOX_MONITOR_EXPORT", "` + MonitorExport + `")
AGENT = "tetragon"
BEAT = 5.0
MAX = 65536


def agent_up():
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open("/proc/%s/comm" % pid) as f:
                    if f.read().strip() == AGENT:
                        return True
            except OSError:
                pass
    return False


def main():
    while not os.path.exists(PORT):
        time.sleep(1)
    port = os.open(PORT, os.O_WRONLY)
    # A file that exists at start holds old events: follow it from its end.
    # One that appears later is read from its start.
    at_end = os.path.exists(EXPORT)
    src, ino, buf, seq, beat = None, None, b"", 0, 0.0
    while True:
        now = time.monotonic()
        if now >= beat:
            seq += 1
            hb = {"abox_heartbeat": {"seq": seq, "agent": AGENT, "agent_up": agent_up()}}
            os.write(port, (json.dumps(hb) + "\n").encode())
            beat = now + BEAT
        if src is None:
            try:
                src = open(EXPORT, "rb")
            except OSError:
                time.sleep(0.5)
                continue
            ino = os.fstat(src.fileno()).st_ino
            if at_end:
                src.seek(0, 2)
            at_end, buf = False, b""
        chunk = src.read(65536)
        if chunk:
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                if 0 < len(line) < MAX:
                    os.write(port, line + b"\n")
            if len(buf) >= MAX:
                buf = b""
            continue
        try:
            st = os.stat(EXPORT)
            if st.st_ino != ino or st.st_size < src.tell():
                src.close()
                src = None  # rotated or truncated: read the new file from its start
                continue
        except OSError:
            pass
        time.sleep(0.2)


main()
`

const monitorUnit = `[Unit]
Description=abox monitor forwarder: Tetragon events to the host over virtio-serial
After=local-fs.target

[Service]
ExecStart=/usr/bin/python3 ` + MonitorForwarderPath + `
Restart=always
RestartSec=2

[Install]
WantedBy=multi-user.target
`

// monitorFiles are the forwarder and its unit.
func monitorFiles() []fileSpec {
	return []fileSpec{
		{Path: MonitorForwarderPath, Owner: "root:root", Permissions: "0755", Content: monitorForwarder},
		{Path: "/etc/systemd/system/" + MonitorUnit, Owner: "root:root", Permissions: "0644", Content: monitorUnit},
	}
}
