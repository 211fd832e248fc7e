package tap

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// pcapStream is a pcap header and n packets of size bytes each, packet i
// filled with byte i, in the given byte order (as tcpdump -w - writes it).
func pcapStream(order binary.ByteOrder, n, size int) []byte {
	hdr := make([]byte, pcapHeaderLen)
	order.PutUint32(hdr, pcapMagicMicros)
	order.PutUint16(hdr[4:], 2)
	order.PutUint16(hdr[6:], 4)
	order.PutUint32(hdr[16:], 262144)
	order.PutUint32(hdr[20:], 1)
	b := hdr
	for i := 0; i < n; i++ {
		rec := make([]byte, pcapRecordLen+size)
		order.PutUint32(rec[8:], uint32(size))
		order.PutUint32(rec[12:], uint32(size))
		for j := pcapRecordLen; j < len(rec); j++ {
			rec[j] = byte(i)
		}
		b = append(b, rec...)
	}
	return b
}

// feed writes b to c in pieces of every size from 1 to 97 bytes, as a
// pipe hands tcpdump's writes over.
func feed(t *testing.T, c *capFile, b []byte) {
	t.Helper()
	for i, step := 0, 1; i < len(b); step = step%97 + 1 {
		j := min(i+step, len(b))
		if n, err := c.Write(b[i:j]); n != j-i || err != nil {
			t.Fatalf("Write = %d, %v; want %d, nil (tcpdump must be able to go on writing)", n, err, j-i)
		}
		i = j
	}
}

func stopped(c *capFile) bool {
	select {
	case <-c.stop:
		return true
	default:
		return false
	}
}

// TestCapFileStopsAtCap: the capture file never passes its cap, ends on a
// whole packet (it is the stream's first packets, byte for byte), and the
// capture is told to stop; with no cap every packet is written.
func TestCapFileStopsAtCap(t *testing.T) {
	for _, order := range []binary.ByteOrder{binary.LittleEndian, binary.BigEndian} {
		stream := pcapStream(order, 50, 100) // 24 + 50*116 bytes
		for _, tc := range []struct {
			name    string
			max     int64
			packets int
		}{
			{"cap inside the 4th packet", pcapHeaderLen + 3*116 + 50, 3},
			{"cap on a packet boundary", pcapHeaderLen + 10*116, 10},
			{"no cap", 0, 50},
			{"cap above the stream", int64(len(stream)) + 1, 50},
		} {
			t.Run(order.String()+"/"+tc.name, func(t *testing.T) {
				path := filepath.Join(t.TempDir(), "c.pcap")
				f, err := os.Create(path)
				if err != nil {
					t.Fatal(err)
				}
				defer f.Close()
				c := newCapFile(f, tc.max)
				feed(t, c, stream)
				got, err := os.ReadFile(path)
				if err != nil {
					t.Fatal(err)
				}
				want := stream[:pcapHeaderLen+tc.packets*116]
				if !bytes.Equal(got, want) {
					t.Fatalf("the file holds %d bytes, want the header and the first %d packets (%d bytes)", len(got), tc.packets, len(want))
				}
				if tc.max > 0 && int64(len(got)) > tc.max {
					t.Fatalf("the file holds %d bytes, past its cap of %d", len(got), tc.max)
				}
				packets, size, cerr := c.result()
				capped := tc.packets < 50
				if packets != tc.packets || size != int64(len(want)) || errors.Is(cerr, ErrCapReached) != capped || stopped(c) != capped {
					t.Errorf("result() = %d packets, %d bytes, %v (stop closed: %v); want %d packets, %d bytes, capped %v",
						packets, size, cerr, stopped(c), tc.packets, len(want), capped)
				}
			})
		}
	}
}

// shortFile is a file on a disk that fills after room bytes: the write
// that passes it is short and fails with ENOSPC.
type shortFile struct {
	*os.File
	room int
}

func (s *shortFile) Write(b []byte) (int, error) {
	if len(b) <= s.room {
		s.room -= len(b)
		return s.File.Write(b)
	}
	n, _ := s.File.Write(b[:s.room])
	s.room = 0
	return n, &os.PathError{Op: "write", Path: s.Name(), Err: syscall.ENOSPC}
}

// TestCapFileDiskFull: when the disk fills, the capture stops with the
// write's error and the file is cut back to its last whole packet, so it
// still opens as a capture.
func TestCapFileDiskFull(t *testing.T) {
	stream := pcapStream(binary.LittleEndian, 20, 100)
	path := filepath.Join(t.TempDir(), "c.pcap")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	c := newCapFile(&shortFile{File: f, room: pcapHeaderLen + 5*116 + 30}, 0)
	feed(t, c, stream)
	packets, size, cerr := c.result()
	if !errors.Is(cerr, syscall.ENOSPC) || !stopped(c) {
		t.Fatalf("result() error %v (stop closed: %v); want ENOSPC and the capture stopped", cerr, stopped(c))
	}
	got, _ := os.ReadFile(path)
	if want := stream[:pcapHeaderLen+5*116]; !bytes.Equal(got, want) || packets != 5 || size != int64(len(want)) {
		t.Errorf("the file holds %d bytes (%d packets, size %d), want the first 5 packets whole (%d bytes)", len(got), packets, size, len(want))
	}
}

// TestCapFileRefusesOtherStreams: output that is not pcap, or a record no
// tcpdump writes, stops the capture rather than being copied unchecked.
func TestCapFileRefusesOtherStreams(t *testing.T) {
	bad := pcapStream(binary.LittleEndian, 2, 10)
	binary.LittleEndian.PutUint32(bad[pcapHeaderLen+8:], maxPcapRecord+1)
	for name, b := range map[string][]byte{
		"pcapng":         append([]byte{0x0a, 0x0d, 0x0d, 0x0a}, make([]byte, 40)...),
		"text":           []byte("tcpdump: listening on lo, link-type EN10MB\n"),
		"record too big": bad,
	} {
		t.Run(name, func(t *testing.T) {
			f, err := os.Create(filepath.Join(t.TempDir(), "c.pcap"))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			c := newCapFile(f, 0)
			feed(t, c, b)
			if _, _, err := c.result(); err == nil || !stopped(c) {
				t.Errorf("result() error %v (stop closed: %v); want an error and the capture stopped", err, stopped(c))
			}
		})
	}
}

// TestCapFileRing: with a ring the capture does not stop at the cap: each
// file stays within it and is a capture of its own (the header, whole
// packets), and the files, oldest first, hold the stream's last packets
// in order, up to its end.
func TestCapFileRing(t *testing.T) {
	const ring, per = 3, 4 // files, packets a file holds
	stream := pcapStream(binary.LittleEndian, 50, 100)
	dir := t.TempDir()
	name := filepath.Join(dir, "c.pcap")
	f, err := os.Create(RingName(name, 0, ring))
	if err != nil {
		t.Fatal(err)
	}
	c := newCapFile(f, pcapHeaderLen+per*116+50)
	c.nextFile = func() (sink, int, error) {
		i := (c.file + 1) % ring
		f, err := os.Create(RingName(name, i, ring))
		return f, i, err
	}
	feed(t, c, stream)
	if err := c.close(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.result(); err != nil || stopped(c) {
		t.Fatalf("result() error %v (stop closed: %v); a ring goes on", err, stopped(c))
	}
	var packets []byte
	for k := 1; k <= ring; k++ { // oldest first: the one after the last written
		i := (c.file + k) % ring
		b, err := os.ReadFile(RingName(name, i, ring))
		if err != nil {
			t.Fatal(err)
		}
		if int64(len(b)) > c.max || !bytes.Equal(b[:pcapHeaderLen], stream[:pcapHeaderLen]) || (len(b)-pcapHeaderLen)%116 != 0 {
			t.Fatalf("file %d: %d bytes, want the header and whole packets within %d", i, len(b), c.max)
		}
		packets = append(packets, b[pcapHeaderLen:]...)
	}
	// 50 packets of 4 a file: files of 4, 4 and the last 2 (50 = 12*4 + 2).
	if want := stream[len(stream)-10*116:]; !bytes.Equal(packets, want) {
		t.Errorf("the ring holds %d bytes of packets, want the stream's last 10 packets in order", len(packets))
	}
}

func TestRingName(t *testing.T) {
	for _, tc := range []struct {
		i, n int
		want string
	}{{0, 2, "d.pcap0"}, {9, 10, "d.pcap9"}, {3, 11, "d.pcap03"}, {10, 11, "d.pcap10"}, {7, 1000, "d.pcap007"}} {
		if got := RingName("d.pcap", tc.i, tc.n); got != tc.want {
			t.Errorf("RingName(d.pcap, %d, %d) = %q, want %q (tcpdump's -W names)", tc.i, tc.n, got, tc.want)
		}
	}
}
