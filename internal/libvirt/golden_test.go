package libvirt

import (
	"flag"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// golden compares got with testdata/name, or rewrites it under -update.
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("reading golden file (run go test -update to create it): %v", err)
	}
	if got != string(want) {
		t.Errorf("%s differs from the golden file (if intended, run go test -update and review the diff)\n--- got:\n%s\n--- want:\n%s", name, got, want)
	}
}

// testParams is a complete, valid parameter set for a TCG instance "dev".
func testParams() Params {
	return Params{
		Name:          "dev",
		UUID:          "4f1c2a7e-9b3d-4c5e-8f6a-0b1c2d3e4f50",
		Bridge:        "abx-ef260e9aa3c",
		Subnet:        netip.MustParsePrefix("10.10.5.0/24"),
		Gateway:       netip.MustParseAddr("10.10.5.1"),
		GuestIP:       netip.MustParseAddr("10.10.5.10"),
		MAC:           "52:54:00:ab:cd:ef",
		ProxyPort:     8080,
		CPUs:          2,
		MemoryMiB:     1024,
		DiskPath:      "/var/lib/abox/instances/dev/disk.qcow2",
		SeedISOPath:   "/var/lib/abox/instances/dev/seed.iso",
		SerialLogPath: "/var/lib/abox/instances/dev/logs/serial.log",
		InstanceDir:   "/var/lib/abox/instances/dev",
		Accel:         AccelTCG,
	}
}

func mustAddr(s string) netip.Addr { return netip.MustParseAddr(s) }
