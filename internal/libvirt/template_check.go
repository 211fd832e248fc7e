package libvirt

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"sync"

	"libvirt.org/go/libvirtxml"

	"github.com/abox-dev/abox/internal/fsutil"
	"github.com/abox-dev/abox/internal/paths"
)

// HostEmulator is the QEMU binary every abox guest runs under: Debian's
// qemu-system-x86 package. A template may name it and nothing else.
const HostEmulator = "/usr/bin/qemu-system-x86_64"

// A domain abox did not build (a user template, the definition a snapshot
// brings back) is held to domainAllowList: every element and attribute,
// all the way down, must be one listed at that place, or the domain is
// refused naming it. libvirt opens the host files a definition names as
// root (serial and console files, disks, firmware, fw_cfg blobs, ROMs,
// TPM state, sockets), so a host path is accepted only where it is one of
// the instance's own files: its overlay disk, its seed, its serial log,
// the base image's kernel and initrd, and sockets in its run directory at
// names abox does not use. Elements that only libvirt writes (aliases it
// picked, the tap it made, the labels it chose) are marked live: allowed
// in a definition libvirt reports, refused in a template.

// domainAllowList is the allow list, built once.
var domainAllowList = sync.OnceValue(buildAllowList)

func buildAllowList() *elem {
	state := &elem{attrs: attrs{"state": onOff}}
	numText := &elem{text: num}
	intText := &elem{text: integer}
	virtio := attrs{"iommu": onOff, "ats": onOff, "packed": onOff, "page_per_vq": onOff}
	with := func(a attrs, more attrs) attrs {
		out := attrs{}
		for k, v := range a {
			out[k] = v
		}
		for k, v := range more {
			out[k] = v
		}
		return out
	}
	virtioDriver := &elem{attrs: virtio}
	alias := &elem{attrs: attrs{"name": token}}
	address := &elem{attrs: attrs{
		"type":   oneOf("pci", "drive", "virtio-serial", "usb", "isa"),
		"domain": hexNum, "bus": hexNum, "slot": hexNum, "function": hexNum, "multifunction": onOff,
		"controller": hexNum, "target": hexNum, "unit": hexNum, "port": dotted, "device": hexNum,
		"iobase": hexNum, "irq": hexNum,
	}}
	acpi := &elem{attrs: attrs{"index": num, "nodeset": cpuset}}
	boot := &elem{attrs: attrs{"order": num, "loadparm": token}, req: []string{"order"}}
	audioRef := &elem{attrs: attrs{"id": num}}
	// device adds what every device may have: alias, address, acpi.
	device := func(e *elem) *elem {
		for _, k := range append([]*elem{e}, mapValues(e.kinds)...) {
			if k.kids == nil {
				k.kids = kids{}
			}
			k.kids["alias"], k.kids["address"], k.kids["acpi"] = alias, address, acpi
		}
		return e
	}

	limit := &elem{attrs: attrs{"unit": unit}, text: num}
	cputune := &elem{kids: kids{
		"shares": numText, "period": numText, "quota": intText,
		"global_period": numText, "global_quota": intText,
		"emulator_period": numText, "emulator_quota": intText,
		"iothread_period": numText, "iothread_quota": intText,
		"vcpupin":     {attrs: attrs{"vcpu": num, "cpuset": cpuset}},
		"emulatorpin": {attrs: attrs{"cpuset": cpuset}},
		"iothreadpin": {attrs: attrs{"iothread": num, "cpuset": cpuset}},
	}}
	numaMode := oneOf("interleave", "strict", "preferred", "restrictive")
	numatune := &elem{kids: kids{
		"memory":  {attrs: attrs{"mode": numaMode, "nodeset": cpuset, "placement": oneOf("static", "auto")}},
		"memnode": {attrs: attrs{"cellid": num, "mode": numaMode, "nodeset": cpuset}},
	}}
	osElem := &elem{kids: kids{
		"type":     {attrs: attrs{"arch": oneOf("x86_64"), "machine": token}, text: oneOf("hvm")},
		"kernel":   {text: kernelPath},
		"initrd":   {text: initrdPath},
		"cmdline":  {text: anyText},
		"boot":     {attrs: attrs{"dev": oneOf("hd", "cdrom", "network", "fd")}},
		"bootmenu": {attrs: attrs{"enable": yesNo, "timeout": num}},
		"bios":     {attrs: attrs{"useserial": yesNo, "rebootTimeout": integer}},
		"smbios":   {attrs: attrs{"mode": oneOf("emulate")}},
	}}
	hyperv := kids{
		"spinlocks": {attrs: attrs{"state": onOff, "retries": num}},
		"stimer":    {attrs: attrs{"state": onOff}, kids: kids{"direct": state}},
		"vendor_id": {attrs: attrs{"state": onOff, "value": token}},
		"tlbflush":  {attrs: attrs{"state": onOff}, kids: kids{"direct": state, "extended": state}},
	}
	for _, n := range []string{"relaxed", "vapic", "vpindex", "runtime", "synic", "reset", "frequencies",
		"reenlightenment", "ipi", "evmcs", "avic", "emsr_bitmap", "xmm_input"} {
		hyperv[n] = state
	}
	features := &elem{kids: kids{
		"pae": {}, "acpi": {}, "apic": {attrs: attrs{"eoi": onOff}},
		"hap": state, "pvspinlock": state, "pmu": state, "vmport": state, "vmcoreinfo": state, "ps2": state,
		"smm":            {attrs: attrs{"state": onOff}, kids: kids{"tseg": limit}},
		"ioapic":         {attrs: attrs{"driver": oneOf("kvm", "qemu")}},
		"msrs":           {attrs: attrs{"unknown": oneOf("ignore", "fault")}},
		"async-teardown": {attrs: attrs{"enabled": yesNo}},
		"hyperv":         {attrs: attrs{"mode": oneOf("custom", "passthrough")}, kids: hyperv},
		"kvm": {kids: kids{"hidden": state, "hint-dedicated": state, "poll-control": state, "pv-ipi": state,
			"dirty-ring": {attrs: attrs{"state": onOff, "size": num}}}},
		"tcg": {kids: kids{"tb-cache": limit}},
	}}
	cpu := &elem{
		attrs: attrs{
			"match": oneOf("minimum", "exact", "strict"), "check": oneOf("none", "partial", "full"),
			"mode": oneOf("custom", "host-model", "host-passthrough", "maximum"), "migratable": onOff,
		},
		kids: kids{
			"model":       {attrs: attrs{"fallback": oneOf("allow", "forbid"), "vendor_id": token}, text: token},
			"vendor":      {text: token},
			"topology":    {attrs: attrs{"sockets": num, "dies": num, "clusters": num, "cores": num, "threads": num}},
			"cache":       {attrs: attrs{"level": num, "mode": oneOf("emulate", "passthrough", "disable")}},
			"maxphysaddr": {attrs: attrs{"mode": oneOf("passthrough", "emulate"), "bits": num, "limit": num}},
			"feature":     {attrs: attrs{"policy": oneOf("force", "require", "optional", "disable", "forbid"), "name": token}},
			"numa": {kids: kids{"cell": {
				attrs: attrs{"id": num, "cpus": cpuset, "memory": num, "unit": unit, "memAccess": oneOf("private"), "discard": yesNo},
				kids:  kids{"distances": {kids: kids{"sibling": {attrs: attrs{"id": num, "value": num}}}}},
			}}},
		},
	}
	clock := &elem{
		attrs: attrs{
			"offset": oneOf("utc", "localtime", "timezone", "variable", "absolute"), "basis": oneOf("utc", "localtime"),
			"adjustment": pattern("seconds or reset", regexp.MustCompile(`^(reset|[+-]?[0-9]{1,20})$`)),
			"timezone":   pattern("a zone name (Europe/Paris)", regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_+-]*(/[A-Za-z0-9_+-]+){0,3}$`)),
			"start":      num,
		},
		kids: kids{"timer": {
			attrs: attrs{
				"name":  oneOf("platform", "pit", "rtc", "hpet", "tsc", "kvmclock", "hypervclock"),
				"track": oneOf("boot", "guest", "wall", "realtime"), "tickpolicy": oneOf("delay", "catchup", "merge", "discard"),
				"frequency": num, "mode": oneOf("auto", "native", "emulate", "paravirt", "smpsafe"), "present": yesNo,
			},
			kids: kids{"catchup": {attrs: attrs{"threshold": num, "slew": num, "limit": num}}},
		}},
	}
	lifecycle := &elem{text: oneOf("destroy", "restart", "preserve", "rename-restart")}

	// Disks: the overlay and the seed, plain files (see checkDisk). The
	// backing chain libvirt reports (what it found in the overlay's
	// header) is the instance's base and nothing more: the base stands
	// alone, so its own <backingStore/> is the chain's empty end.
	backing := &elem{live: true, attrs: attrs{"type": oneOf("file"), "index": num}, kids: kids{
		"format":       {attrs: attrs{"type": oneOf("qcow2")}},
		"source":       {attrs: attrs{"file": backingFile, "index": num}},
		"backingStore": {live: true},
	}}
	iotune := kids{"group_name": {text: token}}
	for _, n := range []string{"total_bytes_sec", "read_bytes_sec", "write_bytes_sec", "total_iops_sec",
		"read_iops_sec", "write_iops_sec", "size_iops_sec"} {
		iotune[n] = numText
		if n != "size_iops_sec" {
			iotune[n+"_max"], iotune[n+"_max_length"] = numText, numText
		}
	}
	disk := device(&elem{by: "type", byDefault: "file", kinds: map[string]*elem{"file": {
		attrs: attrs{"device": oneOf("disk", "cdrom"), "model": token},
		kids: kids{
			"driver": {attrs: with(virtio, attrs{
				"name": oneOf("qemu"), "type": oneOf("qcow2", "raw"),
				"cache":        oneOf("default", "none", "writethrough", "writeback", "directsync", "unsafe"),
				"error_policy": oneOf("stop", "report", "ignore", "enospace"), "rerror_policy": oneOf("stop", "report", "ignore"),
				"io": oneOf("threads", "native", "io_uring"), "ioeventfd": onOff, "event_idx": onOff, "copy_on_read": onOff,
				"discard": oneOf("unmap", "ignore"), "detect_zeroes": oneOf("off", "on", "unmap"),
				"iothread": num, "queues": num, "queue_size": num,
			})},
			"source":       {attrs: attrs{"file": diskFile, "startupPolicy": oneOf("mandatory", "requisite", "optional"), "index": num}, req: []string{"file"}},
			"backingStore": backing,
			"target": {attrs: attrs{"dev": token, "bus": oneOf("virtio", "sata", "scsi", "ide", "usb", "fdc"),
				"tray": oneOf("open", "closed"), "removable": onOff, "rotation_rate": num}},
			"readonly": {},
			"serial":   {text: printable}, "wwn": {text: hexStr}, "vendor": {text: printable}, "product": {text: printable},
			"boot":     boot,
			"geometry": {attrs: attrs{"cyls": num, "heads": num, "secs": num, "trans": oneOf("none", "lba", "auto")}},
			"blockio":  {attrs: attrs{"logical_block_size": num, "physical_block_size": num, "discard_granularity": num}},
			"iotune":   {kids: iotune},
		},
	}}})
	controller := device(&elem{
		attrs: attrs{"type": oneOf("usb", "pci", "virtio-serial", "scsi", "sata", "ide", "fdc"),
			"index": num, "model": token, "ports": num, "vectors": num},
		req: []string{"type"},
		kids: kids{
			"driver": {attrs: with(virtio, attrs{"queues": num, "cmd_per_lun": num, "max_sectors": num, "ioeventfd": onOff, "iothread": num})},
			"model":  {attrs: attrs{"name": token}},
			"target": {attrs: attrs{"chassisNr": num, "chassis": num, "port": hexNum, "busNr": num, "index": num,
				"hotplug": onOff, "memReserve": num}, kids: kids{"node": numText}},
			"pcihole64": limit,
			"master":    {attrs: attrs{"startport": num}},
		},
	})
	// The NIC: on the instance network, through its packet filter (see
	// checkInterface for what must be there).
	nic := device(&elem{by: "type", kinds: map[string]*elem{"network": {kids: kids{
		"mac":    {attrs: attrs{"address": macV}},
		"source": {attrs: attrs{"network": networkName, "portid": liveOnly(uuidV), "bridge": liveOnly(bridgeName)}},
		"target": {live: true, attrs: attrs{"dev": token, "managed": oneOf("no")}},
		"model":  {attrs: attrs{"type": token}},
		"driver": {
			attrs: with(virtio, attrs{"name": oneOf("qemu", "vhost"), "txmode": oneOf("iothread", "timer"),
				"ioeventfd": onOff, "event_idx": onOff, "queues": num, "rx_queue_size": num, "tx_queue_size": num,
				"rss": onOff, "rss_hash_report": onOff}),
			kids: kids{
				"host":  {attrs: attrs{"csum": onOff, "gso": onOff, "tso4": onOff, "tso6": onOff, "ecn": onOff, "ufo": onOff, "mrg_rxbuf": onOff}},
				"guest": {attrs: attrs{"csum": onOff, "tso4": onOff, "tso6": onOff, "ecn": onOff, "ufo": onOff}},
			},
		},
		"filterref": {attrs: attrs{"filter": filterName}, req: []string{"filter"}},
		"boot":      boot,
		"tune":      {kids: kids{"sndbuf": numText}},
		"link":      {attrs: attrs{"state": oneOf("up", "down")}},
		"mtu":       {attrs: attrs{"size": num}},
		"coalesce":  {kids: kids{"rx": {kids: kids{"frames": {attrs: attrs{"max": num}}}}}},
	}}}})
	// Character devices end in a pty, a virtual console, nothing, the
	// serial log (serial and console only, so a guest's output can never
	// overwrite another file) or a socket QEMU binds in run/: never
	// another file, a host device, a pipe, TCP, UDP or a socket it
	// connects to (a host daemon's control socket).
	chardev := func(target *elem, logFile bool, more attrs) *elem {
		ks := map[string]*elem{
			"pty":  {attrs: more, kids: kids{"source": {live: true, attrs: attrs{"path": ptyPath}}}},
			"vc":   {attrs: more, kids: kids{}},
			"null": {attrs: more, kids: kids{}},
			"unix": {attrs: more, need: []string{"source"}, kids: kids{
				"source": {attrs: attrs{"mode": oneOf("bind"), "path": runSocket}, req: []string{"mode", "path"}},
			}},
		}
		if logFile {
			ks["file"] = &elem{attrs: more, need: []string{"source"}, kids: kids{
				"source": {attrs: attrs{"path": serialLog, "append": onOff}, req: []string{"path"}},
			}}
		}
		for _, k := range ks {
			k.kids["target"] = target
		}
		return device(&elem{by: "type", byDefault: "pty", kinds: ks})
	}
	serial := chardev(&elem{
		attrs: attrs{"type": oneOf("isa-serial", "usb-serial", "pci-serial", "system-serial"), "port": num},
		kids:  kids{"model": {attrs: attrs{"name": token}}},
	}, true, nil)
	console := chardev(&elem{attrs: attrs{"type": oneOf("serial", "virtio"), "port": num}}, true, attrs{"tty": liveOnly(ptyPath)})
	channel := chardev(&elem{by: "type", kinds: map[string]*elem{"virtio": {
		attrs: attrs{"name": token, "state": liveOnly(oneOf("connected", "disconnected"))},
	}}}, false, nil)
	input := device(&elem{
		attrs: attrs{"type": oneOf("mouse", "keyboard", "tablet"), "bus": oneOf("ps2", "usb", "virtio"),
			"model": oneOf("virtio", "virtio-transitional", "virtio-non-transitional")},
		req:  []string{"type"},
		kids: kids{"driver": virtioDriver},
	})
	tpm := device(&elem{attrs: attrs{"model": oneOf("tpm-tis", "tpm-crb")}, kids: kids{
		"backend": {by: "type", kinds: map[string]*elem{"emulator": {
			attrs: attrs{"version": oneOf("1.2", "2.0"), "persistent_state": yesNo},
			kids:  kids{"active_pcr_banks": {kids: kids{"sha1": {}, "sha256": {}, "sha384": {}, "sha512": {}}}},
		}}},
	}})
	// Displays: VNC and SPICE on a socket in run/ or a loopback address
	// (see checkGraphics).
	listen := &elem{by: "type", kinds: map[string]*elem{
		"address": {attrs: attrs{"address": loopback}, req: []string{"address"}},
		"socket":  {attrs: attrs{"socket": runSocket}, req: []string{"socket"}},
	}}
	connected := oneOf("keep", "disconnect", "fail")
	compression := &elem{attrs: attrs{"compression": token}}
	graphics := &elem{by: "type", kinds: map[string]*elem{
		"vnc": {
			attrs: attrs{"port": integer, "autoport": yesNo, "socket": runSocket, "listen": loopback, "keymap": token,
				"sharePolicy": oneOf("allow-exclusive", "force-shared", "ignore"), "passwd": anyText, "passwdValidTo": printable,
				"connected": connected, "powerControl": yesNo},
			kids: kids{"listen": listen, "audio": audioRef},
		},
		"spice": {
			attrs: attrs{"port": integer, "tlsPort": integer, "autoport": yesNo, "listen": loopback, "keymap": token,
				"defaultMode": oneOf("any", "secure", "insecure"), "passwd": anyText, "passwdValidTo": printable, "connected": connected},
			kids: kids{
				"listen": listen, "audio": audioRef,
				"channel": {attrs: attrs{"name": oneOf("main", "display", "inputs", "cursor", "playback", "record"),
					"mode": oneOf("any", "secure", "insecure")}},
				"image": compression, "jpeg": compression, "zlib": compression, "playback": compression,
				"streaming":    {attrs: attrs{"mode": oneOf("filter", "all", "off")}},
				"mouse":        {attrs: attrs{"mode": oneOf("server", "client")}},
				"clipboard":    {attrs: attrs{"copypaste": yesNo}},
				"filetransfer": {attrs: attrs{"enable": yesNo}},
			},
		},
	}}
	sound := device(&elem{
		attrs: attrs{"model": oneOf("sb16", "es1370", "pcspk", "ac97", "ich6", "ich7", "ich9", "usb"), "multichannel": yesNo, "streams": num},
		req:   []string{"model"},
		kids:  kids{"codec": {attrs: attrs{"type": oneOf("duplex", "micro", "output")}}, "audio": audioRef},
	})
	audioIO := &elem{
		attrs: attrs{"mixingEngine": yesNo, "fixedSettings": yesNo, "voices": num, "bufferLength": num},
		kids:  kids{"settings": {attrs: attrs{"frequency": num, "channels": num, "format": token}}},
	}
	audioKind := func() *elem {
		return &elem{attrs: attrs{"id": num, "timerPeriod": num}, req: []string{"id"}, kids: kids{"input": audioIO, "output": audioIO}}
	}
	audio := &elem{by: "type", kinds: map[string]*elem{"none": audioKind(), "spice": audioKind()}}
	video := device(&elem{kids: kids{
		"model": {
			attrs: attrs{"type": oneOf("vga", "cirrus", "vmvga", "qxl", "virtio", "bochs", "ramfb", "none"),
				"heads": num, "ram": num, "vram": num, "vram64": num, "vgamem": num, "primary": yesNo, "edid": onOff},
			kids: kids{
				"acceleration": {attrs: attrs{"accel3d": oneOf("no"), "accel2d": yesNo}},
				"resolution":   {attrs: attrs{"x": num, "y": num}},
			},
		},
		"driver": {attrs: with(virtio, attrs{"name": oneOf("qemu")})},
	}})
	watchdog := device(&elem{
		attrs: attrs{"model": oneOf("i6300esb", "ib700", "itco"), "action": oneOf("reset", "shutdown", "poweroff", "pause", "none", "inject-nmi")},
		req:   []string{"model"},
	})
	memballoon := device(&elem{
		attrs: attrs{"model": oneOf("virtio", "virtio-transitional", "virtio-non-transitional", "none"), "autodeflate": onOff, "freePageReporting": onOff},
		req:   []string{"model"},
		kids:  kids{"driver": virtioDriver, "stats": {attrs: attrs{"period": num}}},
	})
	rng := device(&elem{
		attrs: attrs{"model": oneOf("virtio", "virtio-transitional", "virtio-non-transitional")},
		req:   []string{"model"},
		kids: kids{
			"driver": virtioDriver,
			"rate":   {attrs: attrs{"bytes": num, "period": num}},
			"backend": {by: "model", kinds: map[string]*elem{
				"random":  {text: oneOf("", "/dev/urandom", "/dev/random")},
				"builtin": {},
			}},
		},
	})
	panicDev := device(&elem{attrs: attrs{"model": oneOf("isa", "hyperv", "pvpanic")}})

	return &elem{
		attrs: attrs{"type": oneOf("kvm", "qemu"), "id": liveOnly(num)},
		req:   []string{"type"},
		kids: kids{
			"name":          {text: domainName},
			"uuid":          {text: uuidV},
			"genid":         {text: optional(uuidV)},
			"title":         {text: printable},
			"description":   {text: anyText},
			"metadata":      {skip: true},
			"maxMemory":     {attrs: attrs{"unit": unit, "slots": num}, text: num},
			"memory":        {attrs: attrs{"unit": unit, "dumpCore": onOff}, text: num},
			"currentMemory": {attrs: attrs{"unit": unit}, text: num},
			"memtune":       {kids: kids{"hard_limit": limit, "soft_limit": limit, "min_guarantee": limit, "swap_hard_limit": limit}},
			"vcpu":          {attrs: attrs{"placement": oneOf("static", "auto"), "cpuset": cpuset, "current": num}, text: num},
			"vcpus":         {kids: kids{"vcpu": {attrs: attrs{"id": num, "enabled": yesNo, "hotpluggable": yesNo, "order": num}}}},
			"iothreads":     numText,
			"iothreadids": {kids: kids{"iothread": {
				attrs: attrs{"id": num, "thread_pool_min": num, "thread_pool_max": num},
				kids:  kids{"poll": {attrs: attrs{"max": num, "grow": num, "shrink": num}}},
			}}},
			"cputune":     cputune,
			"numatune":    numatune,
			"resource":    {live: true, kids: kids{"partition": {text: printable}}},
			"os":          osElem,
			"features":    features,
			"cpu":         cpu,
			"clock":       clock,
			"on_poweroff": lifecycle, "on_reboot": lifecycle, "on_crash": lifecycle,
			"pm":   {kids: kids{"suspend-to-mem": {attrs: attrs{"enabled": yesNo}}, "suspend-to-disk": {attrs: attrs{"enabled": yesNo}}}},
			"perf": {kids: kids{"event": {attrs: attrs{"name": token, "enabled": yesNo}}}},
			"devices": {kids: kids{
				"emulator": {text: hostEmulator},
				"disk":     disk, "controller": controller, "interface": nic,
				"serial": serial, "console": console, "channel": channel,
				"input": input, "tpm": tpm, "graphics": graphics, "sound": sound, "audio": audio, "video": video,
				"watchdog": watchdog, "memballoon": memballoon, "rng": rng, "panic": panicDev,
			}},
			// Only libvirt's dynamic labels confine QEMU: no static
			// label, no relabel='no', no base label to start from.
			"seclabel": {by: "type", byDefault: "dynamic", kinds: map[string]*elem{"dynamic": {
				attrs: attrs{"model": oneOf("apparmor", "selinux", "dac"), "relabel": oneOf("yes")},
				kids:  kids{"label": {live: true, text: printable}, "imagelabel": {live: true, text: printable}},
			}}},
		},
	}
}

func mapValues(m map[string]*elem) []*elem {
	out := make([]*elem, 0, len(m))
	for _, k := range sortedKeys(m) {
		out = append(out, m[k])
	}
	return out
}

// refusedWhy says why the allow list leaves out what people ask for.
var refusedWhy = why{
	"qemu:commandline":              "it can attach devices outside the packet filter",
	"qemu:capabilities":             "it changes QEMU devices behind libvirt's back",
	"qemu:override":                 "it changes QEMU devices behind libvirt's back",
	"qemu:deprecation":              "it changes QEMU's behaviour behind libvirt's back",
	"memoryBacking":                 "file-backed or shared guest memory is a host file",
	"sysinfo":                       "fw_cfg entries are read from host files (use <smbios mode='emulate'/>)",
	"blkiotune":                     "it names host block devices",
	"bootloader":                    "it runs a host program",
	"bootloader_args":               "it runs a host program",
	"os/loader":                     "firmware is a host file (leave it out: libvirt's default firmware runs)",
	"os/nvram":                      "a variable store and its template are host files",
	"os/varstore":                   "a variable store is a host file",
	"os/firmware":                   "firmware autoselection picks host files",
	"os/acpi":                       "ACPI tables are host files",
	"os/dtb":                        "a device tree is a host file",
	"os/shim":                       "a shim is a host file",
	"os@firmware":                   "firmware autoselection picks host files",
	"cputune/vcpusched":             "real-time scheduling of guest threads can starve the host",
	"cputune/iothreadsched":         "real-time scheduling of guest threads can starve the host",
	"cputune/emulatorsched":         "real-time scheduling of guest threads can starve the host",
	"cputune/cachetune":             "it partitions the host's caches",
	"cputune/memorytune":            "it partitions the host's memory bandwidth",
	"cell@memAccess":                "memAccess='shared' shares guest memory with host processes",
	"smbios@mode":                   "host mode copies the host's SMBIOS data",
	"filesystem":                    "it shares a host directory with the guest",
	"hostdev":                       "it passes a host device through to the guest",
	"redirdev":                      "it redirects a USB device over a channel around the packet filter",
	"redirfilter":                   "it belongs to USB redirection, which is not allowed",
	"smartcard":                     "a smartcard is a host device or a channel around the packet filter",
	"parallel":                      "a parallel port is a channel to a host file, device or socket",
	"shmem":                         "it shares memory with host processes",
	"devices/memory":                "nvdimm, pmem and virtio-mem devices are backed by host files",
	"devices/nvram":                 "it is a host file",
	"pstore":                        "it writes a host file",
	"vsock":                         "it is a channel to the host around the packet filter",
	"crypto":                        "it reaches the host's crypto devices",
	"iommu":                         "abox does not know it to be harmless",
	"lease":                         "it names a host lock file",
	"hub":                           "it belongs to USB redirection, which is not allowed",
	"disk[block]":                   "a disk that is not a plain file reaches outside the instance (block devices, host directories, network and pool disks)",
	"disk[dir]":                     "a disk that is not a plain file reaches outside the instance (block devices, host directories, network and pool disks)",
	"disk[network]":                 "a disk that is not a plain file reaches outside the instance (block devices, host directories, network and pool disks)",
	"disk[volume]":                  "a disk that is not a plain file reaches outside the instance (block devices, host directories, network and pool disks)",
	"disk@type":                     "a disk that is not a plain file reaches outside the instance",
	"disk@device":                   "a lun or floppy passes the disk through differently; only disk and cdrom",
	"disk/backingStore":             "libvirt would trust the backing chain it names over the overlay's own",
	"disk/mirror":                   "it copies the disk to another host file",
	"disk/auth":                     "it is for network disks",
	"disk/encryption":               "it names a host secret",
	"disk/shareable":                "abox's disks are the instance's own",
	"disk/transient":                "it makes an overlay in a host file of libvirt's choosing",
	"disk@rawio":                    "raw I/O reaches the host device",
	"disk@sgio":                     "SCSI commands reach the host device",
	"disk@snapshot":                 "abox decides how a disk is snapshotted",
	"source/seclabel":               "only libvirt's dynamic labels confine QEMU",
	"source/reservations":           "persistent reservations talk to a host helper's socket",
	"interface[bridge]":             "abox guests are on the instance network only (use <interface type='network'> with <source network='{{.NetworkName}}'/>)",
	"interface@type":                "abox guests are on the instance network only (use <interface type='network'> with <source network='{{.NetworkName}}'/>)",
	"interface/script":              "it runs a host program as root",
	"interface/downscript":          "it runs a host program as root",
	"interface/rom":                 "a ROM is a host file",
	"interface/backend":             "it names host tap and vhost devices",
	"interface/target":              "it names a host tap",
	"interface/virtualport":         "it attaches the NIC to a host switch port",
	"interface/vlan":                "it tags traffic for the host's switch",
	"interface/ip":                  "addresses are the instance network's",
	"interface/route":               "routes are the instance network's",
	"interface/portForward":         "it forwards host ports into the guest",
	"interface/bandwidth":           "abox does not know it to be harmless",
	"interface/port":                "it isolates ports on the host bridge, which abox's filter does",
	"interface@managed":             "it is for host taps and passed-through NICs",
	"interface@trustGuestRxFilters": "the host would take the guest's MAC filters",
	"filterref/parameter":           "the packet filter takes no parameters (add <filterref filter='{{.FilterName}}'/>, without parameters)",
	"serial/log":                    "it writes the port's output to a host file",
	"console/log":                   "it writes the console's output to a host file",
	"channel/log":                   "it writes the channel's output to a host file",
	"serial/protocol":               "it belongs to TCP backends",
	"console/protocol":              "it belongs to TCP backends",
	"channel/protocol":              "it belongs to TCP backends",
	"source/reconnect":              "QEMU would connect to a socket (only sockets it binds are allowed)",
	"channel[file]":                 "the only file a guest may write is its serial log, on a serial port or console",
	"target[guestfwd]":              "a guestfwd target forwards guest connections to the host",
	"domain@type":                   "use {{.DomainType}}",
	"source@mode":                   "only sockets QEMU binds (mode='bind') are allowed: one it connects to is a host daemon's",
	"input/source":                  "it is a host input device",
	"input@type":                    "evdev and passthrough inputs are host input devices; only mouse, keyboard and tablet without a host source are allowed",
	"backend[passthrough]":          "it passes the host's TPM through; only the emulator backend (swtpm, its state kept by libvirt) is allowed",
	"backend[external]":             "it connects to a socket of the template's choosing; only the emulator backend is allowed",
	"backend/source":                "the emulated TPM's state would be a host file or directory of the template's choosing, not libvirt's own",
	"backend/encryption":            "it names a host secret",
	"backend/profile":               "abox does not know it to be harmless",
	"backend[egd]":                  "an egd backend is a socket; use builtin or /dev/urandom",
	"backend@text":                  "another device is a host file; use builtin or /dev/urandom",
	"graphics[sdl]":                 "SDL opens a window on a host X display (display, xauth): QEMU would be a client of the host's desktop",
	"graphics[egl-headless]":        "it renders on a host GPU (render node)",
	"graphics[desktop]":             "only vnc and spice (on a socket in the run directory or a loopback address) are allowed",
	"graphics[rdp]":                 "only vnc and spice (on a socket in the run directory or a loopback address) are allowed",
	"graphics[dbus]":                "only vnc and spice (on a socket in the run directory or a loopback address) are allowed",
	"graphics/gl":                   "OpenGL renders on a host GPU (render node)",
	"graphics@websocket":            "a WebSocket listener is one more way in",
	"listen[network]":               "a display reachable from a network is a way in and out the packet filter does not see",
	"@rendernode":                   "it is a host GPU device",
	"acceleration@accel3d":          "3D acceleration renders on a host GPU",
	"model@blob":                    "blob resources share guest memory with the host's display",
	"audio[sdl]":                    "SDL audio plays on (and records from) the host's sound system",
	"audio[pulseaudio]":             "a sound server carries what the guest plays; only types none and spice are allowed",
	"audio[pipewire]":               "a sound server carries what the guest plays; only types none and spice are allowed",
	"audio[alsa]":                   "a host sound device carries what the guest plays; only types none and spice are allowed",
	"audio[oss]":                    "a host sound device carries what the guest plays; only types none and spice are allowed",
	"audio[jack]":                   "a sound server carries what the guest plays; only types none and spice are allowed",
	"audio[coreaudio]":              "only types none and spice are allowed",
	"audio[file]":                   "a host file would hold what the guest plays; only types none and spice are allowed",
	"audio[dbus]":                   "only types none and spice are allowed",
	"watchdog@action":               "dump writes the guest's memory to a host file",
	"on_crash@text":                 "a core dump is written to a host file",
	"on_poweroff@text":              "a core dump is written to a host file",
	"on_reboot@text":                "a core dump is written to a host file",
	"on_lockfailure":                "it belongs to host lock managers",
	"seclabel[none]":                "it runs QEMU unconfined",
	"seclabel[static]":              "a static label is the template's, not libvirt's: only dynamic labels confine QEMU",
	"seclabel/baselabel":            "QEMU would run under a label of the template's choosing instead of libvirt's confined one",
	"seclabel/label":                "a label is libvirt's to choose: only dynamic labels confine QEMU",
	"seclabel/imagelabel":           "a label is libvirt's to choose: only dynamic labels confine QEMU",
	"seclabel@relabel":              "relabel='no' leaves the instance's files to whatever label they have",
	"launchSecurity":                "abox does not know it to be harmless",
	"idmap":                         "it belongs to containers",
	"keywrap":                       "abox does not know it to be harmless",
	"resource":                      "only libvirt sets it",
}

// hostRole is a value that must be one of the instance's own paths.
func hostRole(what, hint string, want func(Params) []string) value {
	return func(c *checker, v string) error {
		for _, w := range want(c.p) {
			if w != "" && v == w {
				return nil
			}
		}
		return fmt.Errorf("%q is not %s (%s)", v, what, hint)
	}
}

var (
	domainName  = hostRole("the instance's domain name", "use {{.DomainName}}", func(p Params) []string { return []string{DomainName(p.Name)} })
	networkName = hostRole("the instance's network", "use <source network='{{.NetworkName}}'/>",
		func(p Params) []string { return []string{NetworkName(p.Name)} })
	filterName = hostRole("the instance's packet filter", "use <filterref filter='{{.FilterName}}'/>",
		func(p Params) []string { return []string{FilterName(p.Name)} })
	bridgeName = hostRole("the instance's bridge", "libvirt reports it", func(p Params) []string { return []string{p.Bridge} })
	diskFile   = hostRole("the instance's overlay or seed", "a template's disks are {{.DiskPath}} and {{.SeedISOPath}}",
		func(p Params) []string { return []string{p.DiskPath, p.SeedISOPath} })
	serialLog = hostRole("the instance's serial log", "the only file a guest may write is {{.SerialLogPath}}",
		func(p Params) []string { return []string{p.SerialLogPath} })
	kernelPath   = hostRole("the base image's kernel", "use {{.Kernel}}", func(p Params) []string { return []string{p.Kernel} })
	initrdPath   = hostRole("the base image's initrd", "use {{.Initrd}}", func(p Params) []string { return []string{p.Initrd} })
	hostEmulator = hostRole("the host's QEMU", "guests run under "+HostEmulator+"; leave <emulator> out",
		func(Params) []string { return []string{HostEmulator} })
	ptyPath = pattern("a pty (/dev/pts/N)", regexp.MustCompile(`^/dev/pts/[0-9]{1,9}$`))
)

// optional allows v empty too.
func optional(v value) value {
	return func(c *checker, s string) error {
		if s == "" {
			return nil
		}
		return v(c, s)
	}
}

// backingFile: the one backing file an overlay may name is its base's
// disk (Params.BackingPath); any other is a host file the guest would read.
var backingFile = hostRole("the instance's base image", "an overlay's only backing file is the disk of the base it was created on",
	func(p Params) []string { return []string{p.BackingPath} })

func loopback(_ *checker, v string) error {
	ip, err := netip.ParseAddr(v)
	if err != nil || !ip.IsLoopback() {
		return fmt.Errorf("%q is not a loopback address: a display reachable from a network is a way in and out the packet filter does not see", v)
	}
	return nil
}

var socketName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)

// runSocket allows a UNIX socket QEMU binds only directly in the
// instance's run directory, at a name abox itself does not use there
// (paths.InstanceIn names them all: a socket over the filter daemon's
// api.sock would stand in for its control API). The path is clean and
// neither it nor the run directory is a symbolic link. The monitor's
// socket is abox's own channel: allowed in a definition libvirt reports,
// never in a template (RenderTemplate adds it).
func runSocket(c *checker, v string) error {
	run := ""
	if c.p.InstanceDir != "" {
		run = filepath.Join(c.p.InstanceDir, "run")
	}
	if run == "" {
		return fmt.Errorf("socket %q: abox has no run directory for this instance", v)
	}
	if !fsutil.Within(v, run) || filepath.Dir(v) != run || !socketName.MatchString(filepath.Base(v)) {
		return fmt.Errorf("socket %q: put it directly in the instance's run directory %s, named with letters, digits and . _ -", v, run)
	}
	if c.live && v == c.p.MonitorSocket {
		return nil
	}
	for _, r := range c.reserved {
		if v == r || fsutil.Within(r, v) {
			return fmt.Errorf("socket %q is a path abox itself uses in the instance directory; pick another name", v)
		}
	}
	for _, p := range []string{run, v} {
		if fi, err := os.Lstat(p); err == nil && fi.Mode()&os.ModeSymlink != 0 {
			return fmt.Errorf("socket %q: %s is a symbolic link", v, p)
		}
	}
	return nil
}

// reservedPaths are every path paths.InstanceIn names for dir.
func reservedPaths(dir string) []string {
	if dir == "" {
		return nil
	}
	var out []string
	v := reflect.ValueOf(paths.InstanceIn(dir))
	for i := range v.NumField() {
		if s, ok := v.Field(i).Interface().(string); ok && s != "" && s != dir {
			out = append(out, s)
		}
	}
	return out
}

func newChecker(p Params, live bool) *checker {
	return &checker{p: p, live: live, reserved: reservedPaths(p.InstanceDir), why: refusedWhy}
}

// checkTemplate checks a rendered template, doc, against the allow list
// and then what must be there, and returns it parsed (with the disks'
// formats filled in where the template left them out).
func checkTemplate(doc string, p Params) (*libvirtxml.Domain, error) {
	if err := newChecker(p, false).checkDocument(doc, domainAllowList()); err != nil {
		var r *refusal
		if errors.As(err, &r) {
			return nil, err
		}
		return nil, fmt.Errorf("it is not a libvirt domain document: %w", err)
	}
	var d libvirtxml.Domain
	if err := d.Unmarshal(doc); err != nil {
		return nil, fmt.Errorf("it is not a libvirt domain document: %w", err)
	}
	if err := checkTemplateDomain(&d, p); err != nil {
		return nil, err
	}
	return &d, nil
}

// checkTemplateDomain checks what the allow list cannot say, element by
// element: what must be there (the filtered NIC), and how the parts
// relate (which disk is the overlay).
func checkTemplateDomain(d *libvirtxml.Domain, p Params) error {
	dev := d.Devices
	if dev == nil || len(dev.Interfaces) == 0 {
		return fmt.Errorf("no <interface>: the guest needs one on network %q with <filterref filter='{{.FilterName}}'/>", NetworkName(p.Name))
	}
	for i, nic := range dev.Interfaces {
		if err := checkInterface(nic, p); err != nil {
			return fmt.Errorf("interface %d: %w", i, err)
		}
	}
	for i := range dev.Disks {
		if err := checkDisk(&dev.Disks[i], p); err != nil {
			return fmt.Errorf("disk %d: %w", i, err)
		}
	}
	for i, c := range dev.Channels {
		if c.Target == nil || c.Target.VirtIO == nil {
			return fmt.Errorf("channel %d needs a virtio target (<target type='virtio' name='...'/>)", i)
		}
	}
	for i, g := range dev.Graphics {
		if err := checkGraphics(g); err != nil {
			return fmt.Errorf("graphics %d: %w", i, err)
		}
	}
	return nil
}

func checkInterface(nic libvirtxml.DomainInterface, p Params) error {
	if nic.Source == nil || nic.Source.Network == nil || nic.Source.Network.Network != NetworkName(p.Name) {
		return fmt.Errorf("not on network %q (use <interface type='network'> with <source network='{{.NetworkName}}'/>)", NetworkName(p.Name))
	}
	if nic.FilterRef == nil || nic.FilterRef.Filter != FilterName(p.Name) || len(nic.FilterRef.Parameters) > 0 {
		return fmt.Errorf("does not reference the packet filter (add <filterref filter='{{.FilterName}}'/>, without parameters)")
	}
	return nil
}

// checkDisk: the allow list holds a disk to a plain file that is the
// instance's overlay or seed; here the overlay is qcow2 and writable and
// the seed raw and read-only, their formats filled in where the template
// leaves them out: a raw overlay would let the guest write a qcow2 header
// naming any host file into a disk abox later opens as qcow2.
func checkDisk(disk *libvirtxml.DomainDisk, p Params) error {
	if disk.Source == nil || disk.Source.File == nil || disk.Source.File.File == "" {
		return fmt.Errorf("a disk needs a plain file source: the instance's overlay ({{.DiskPath}}) or seed ({{.SeedISOPath}})")
	}
	if disk.Driver == nil {
		disk.Driver = &libvirtxml.DomainDiskDriver{Name: "qemu"}
	}
	want := "raw"
	switch path := disk.Source.File.File; path {
	case p.DiskPath:
		want = "qcow2"
		if disk.ReadOnly != nil {
			return fmt.Errorf("the overlay %s cannot be read-only", path)
		}
	case p.SeedISOPath:
		disk.ReadOnly = &libvirtxml.DomainDiskReadOnly{}
	default:
		return fmt.Errorf("source file %q is not allowed: a template's disks are the instance's overlay ({{.DiskPath}}) and seed ({{.SeedISOPath}})", path)
	}
	switch disk.Driver.Type {
	case "":
		disk.Driver.Type = want
	case want:
	default:
		return fmt.Errorf("%s is %s, not %q: give <driver name='qemu' type='%s'/> or leave the type out", disk.Source.File.File, want, disk.Driver.Type, want)
	}
	return nil
}

// checkGraphics: VNC and SPICE must say where they listen (the allow list
// holds that to a socket in the run directory or a loopback address):
// libvirt's default comes from qemu.conf.
func checkGraphics(g libvirtxml.DomainGraphic) error {
	switch {
	case g.VNC != nil && (g.VNC.Socket != "" || g.VNC.Listen != "" || len(g.VNC.Listeners) > 0):
	case g.Spice != nil && (g.Spice.Listen != "" || len(g.Spice.Listeners) > 0):
	default:
		return fmt.Errorf("vnc and spice must listen on a socket in the instance's run directory or an explicit loopback address (<listen type='address' address='127.0.0.1'/>)")
	}
	return nil
}
