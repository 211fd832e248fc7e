package connio

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"io"
	"math/big"
	"net"
	"sync/atomic"
	"testing"
	"time"
)

// countingConn counts the writes that reach the connection.
type countingConn struct {
	net.Conn
	writes atomic.Int64
}

func (c *countingConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

// tlsPair is a TCP connection with a coalesced TLS server on one end and a
// plain tls.Client on the other.
func tlsPair(t *testing.T) (*FlushConn, *countingConn, *tls.Conn) {
	t.Helper()
	cc, sc := tcpPair(t)
	leaf, roots := selfSigned(t, "pair.test")
	cnt := &countingConn{Conn: sc}
	fc := NewCoalescedServer(cnt, &tls.Config{Certificates: []tls.Certificate{leaf}})
	client := tls.Client(cc, &tls.Config{ServerName: "pair.test", RootCAs: roots})
	t.Cleanup(func() { fc.Close(); client.Close() })
	errc := make(chan error, 1)
	go func() { errc <- fc.Handshake() }()
	if err := client.Handshake(); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	return fc, cnt, client
}

// TestCoalescerHoldsNothingAfterWrite: every Write through a coalesced TLS
// connection has handed all its bytes to the socket when it returns (the
// peer reads them with nothing more written), in order and byte for byte,
// whether it was gathered or went straight through; a large Write takes
// one socket write, not one per record.
func TestCoalescerHoldsNothingAfterWrite(t *testing.T) {
	fc, cnt, client := tlsPair(t)
	// Write sizes around every threshold: below coalesceMin (straight
	// through), one record, many records, and more than coalesceBuf.
	sizes := []int{1, coalesceMin - 1, coalesceMin, 16 << 10, 16<<10 + 1, 100 << 10, 256 << 10, coalesceBuf + 70<<10, 3, 1 << 20}
	all := pattern(4 << 20)
	off := 0
	br := make([]byte, 1<<20)
	for _, n := range sizes {
		b := all[off : off+n]
		off += n
		before := cnt.writes.Load()
		w, err := fc.Write(b)
		if err != nil || w != n {
			t.Fatalf("Write(%d) = %d, %v", n, w, err)
		}
		if h := fc.co.held(); h != 0 {
			t.Fatalf("after Write(%d) returned, %d bytes are still held by the coalescer", n, h)
		}
		if n == 256<<10 {
			if k := cnt.writes.Load() - before; k > 1 {
				t.Errorf("a 256 KiB write took %d socket writes; want them gathered into 1", k)
			}
		}
		// Nothing else is written until the peer has read all of b: bytes
		// held back would never arrive. The deadline only ends a hang.
		client.SetReadDeadline(time.Now().Add(20 * time.Second))
		if _, err := io.ReadFull(client, br[:n]); err != nil {
			t.Fatalf("reading the %d bytes of a returned Write: %v", n, err)
		}
		if !bytes.Equal(br[:n], b) {
			t.Fatalf("the %d bytes of a Write arrived altered or out of order", n)
		}
	}
}

// TestCoalescerErrorIsSticky: once the socket fails, the Write that hit it
// and every later one report an error and nothing stays gathered.
func TestCoalescerErrorIsSticky(t *testing.T) {
	fc, cnt, _ := tlsPair(t)
	cnt.Conn.Close()
	for i := 0; i < 2; i++ {
		if n, err := fc.Write(pattern(200 << 10)); err == nil {
			t.Fatalf("write %d to a closed socket: %d bytes, no error", i, n)
		}
		if h := fc.co.held(); h != 0 {
			t.Fatalf("%d bytes held after a failed write", h)
		}
	}
}

// scriptConn serves reads from a script of chunks: a read returns at most
// what is left of the current chunk, as a socket returns what has arrived.
type scriptConn struct {
	net.Conn
	chunks [][]byte
	reads  int
}

func (c *scriptConn) Read(p []byte) (int, error) {
	c.reads++
	if len(c.chunks) == 0 {
		return 0, io.EOF
	}
	n := copy(p, c.chunks[0])
	if c.chunks[0] = c.chunks[0][n:]; len(c.chunks[0]) == 0 {
		c.chunks = c.chunks[1:]
	}
	return n, nil
}

// TestReadBufLargeReadsThenGivesBack: once a read fills the caller's
// buffer, readBuf reads up to readBufSize at once, serves the bytes in
// order, and gives its buffer back when a small read has been drained, so a
// connection that went quiet holds none.
func TestReadBufLargeReadsThenGivesBack(t *testing.T) {
	all := pattern(900<<10 + 10)
	sc := &scriptConn{chunks: [][]byte{all[:900<<10], all[900<<10:]}}
	rb := NewReadBuf(sc)
	var got []byte
	p := make([]byte, 16<<10)
	held := false
	// Read exactly what was sent: the connection then goes quiet (no EOF).
	for len(got) < len(all) {
		n, err := rb.Read(p)
		got = append(got, p[:n]...)
		held = held || rb.big != nil
		if err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Equal(got, all) {
		t.Fatalf("read %d bytes, want %d exact", len(got), len(all))
	}
	if !held {
		t.Fatal("a bulk stream never switched to large reads")
	}
	// 900 KiB in 16 KiB pieces would take 57 reads of the connection.
	if sc.reads > 12 {
		t.Errorf("%d reads of the connection for 900 KiB; want large reads", sc.reads)
	}
	if rb.big != nil {
		t.Error("the buffer is still held after a small read was drained")
	}
}

// selfSigned is a certificate for name and the pool that trusts it.
func selfSigned(t *testing.T, name string) (tls.Certificate, *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: name},
		DNSNames:     []string{name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IsCA:         true, BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(cert)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: cert}, roots
}
