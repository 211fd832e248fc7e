package image

import (
	"context"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
)

func hexSHA256(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }
func hexSHA512(b []byte) string { s := sha512.Sum512(b); return hex.EncodeToString(s[:]) }

// mirror serves files by path; with chunked set it sends no Content-Length,
// as a server streaming a body does.
type mirror struct {
	files   map[string][]byte
	chunked bool
}

func (m mirror) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, ok := m.files[r.URL.Path]
	if !ok {
		http.NotFound(w, r)
		return
	}
	if m.chunked {
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
	} else {
		w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	}
	w.Write(b)
}

func TestCatalog(t *testing.T) {
	seen := map[string]bool{}
	for _, e := range Catalog() {
		t.Run(e.Name, func(t *testing.T) {
			if err := ValidateName(e.Name); err != nil {
				t.Errorf("name: %v", err)
			}
			if seen[e.Name] {
				t.Errorf("name %s listed twice", e.Name)
			}
			seen[e.Name] = true
			if _, ok := hexRE[e.Algorithm]; !ok {
				t.Errorf("algorithm %q is not supported", e.Algorithm)
			}
			img, sums, err := e.URLs("")
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(img, "https://") || !strings.HasSuffix(img, "/"+e.File) {
				t.Errorf("image URL %s: want https:// and ending in the sums file name %s", img, e.File)
			}
			dir := img[:strings.LastIndex(img, "/")]
			if want := dir + "/" + strings.ToUpper(string(e.Algorithm)) + "SUMS"; sums != want {
				t.Errorf("sums URL = %s, want %s (same directory as the image)", sums, want)
			}
		})
	}
	if _, err := LookupCatalog("debian-12"); err != nil {
		t.Errorf("LookupCatalog(debian-12) = %v", err)
	}
	_, err := LookupCatalog("fedora-40")
	if !errors.Is(err, ErrUnknownCatalog) || !strings.Contains(err.Error(), "debian-12, debian-13, ubuntu-22.04, ubuntu-24.04") {
		t.Errorf("LookupCatalog(fedora-40) = %v, want ErrUnknownCatalog listing the names", err)
	}
}

func TestCatalogEntryURLs(t *testing.T) {
	e, err := LookupCatalog("ubuntu-24.04")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		mirror, wantImage, wantErr string
	}{
		{"", "https://cloud-images.ubuntu.com/noble/current/noble-server-cloudimg-amd64.img", ""},
		{"http://127.0.0.1:8080", "http://127.0.0.1:8080/noble/current/noble-server-cloudimg-amd64.img", ""},
		{"https://m.example/ubuntu/", "https://m.example/ubuntu/noble/current/noble-server-cloudimg-amd64.img", ""},
		{"ftp://m.example", "", "want an https:// URL"},
		{"/srv/images", "", "want an https:// URL"},
		{"http://m.example/?x=1", "", "without query"},
		{"http://m.example/debian", "", "must use https"},
		{"http://10.1.2.3/debian", "", "must use https"},
		{"http://localhost:8080", "http://localhost:8080/noble/current/noble-server-cloudimg-amd64.img", ""},
	}
	for _, tt := range tests {
		t.Run(tt.mirror, func(t *testing.T) {
			img, _, err := e.URLs(tt.mirror)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Errorf("URLs(%q) = %s, %v; want error containing %q", tt.mirror, img, err, tt.wantErr)
				}
				return
			}
			if err != nil || img != tt.wantImage {
				t.Errorf("URLs(%q) = %s, %v; want %s", tt.mirror, img, err, tt.wantImage)
			}
		})
	}
}

func TestFindSum(t *testing.T) {
	a := strings.Repeat("a", 64)
	b := strings.Repeat("b", 64)
	const f = "noble-server-cloudimg-amd64.img"
	tests := []struct {
		name, data, want, wantErr string
	}{
		{"text mode", b + "  other.img\n" + a + "  " + f + "\n", a, ""},
		{"binary mode", a + " *" + f + "\n", a, ""},
		{"dot slash", a + "  ./" + f + "\n", a, ""},
		{"uppercase hex", strings.ToUpper(a) + "  " + f + "\n", a, ""},
		{"crlf, blank and comment lines", "# sums\r\n\r\n" + a + " *" + f + "\r\n", a, ""},
		{"same sum twice", a + "  " + f + "\n" + a + " *" + f + "\n", a, ""},
		{"missing", b + "  other.img\n", "", "no sha256 for " + f},
		{"prefix is not a match", a + "  " + f + ".vhd\n", "", "no sha256"},
		{"ambiguous", a + "  " + f + "\n" + b + "  " + f + "\n", "", "2 different sha256 sums"},
		{"sha512 length for sha256", strings.Repeat("c", 128) + "  " + f + "\n", "", "line 1: checksum"},
		{"not hex", strings.Repeat("z", 64) + "  " + f + "\n", "", "not a hex sha256"},
		{"one space only", a + " " + f + "\n", "", `line 1: want "HEX  NAME"`},
		{"html", "<html><body>captive portal</body></html>\n", "", "line 1"},
		{"empty", "", "", "no sha256"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := FindSum([]byte(tt.data), f, SHA256)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Errorf("FindSum = %v, %v; want error containing %q", got, err, tt.wantErr)
				}
				return
			}
			if err != nil || got != (Checksum{SHA256, tt.want}) {
				t.Errorf("FindSum = %v, %v; want sha256 %s", got, err, tt.want)
			}
		})
	}
}

// catalogFixture is an upstream copy under /mirror serving debian-12
// (SHA512SUMS) and ubuntu-24.04 (SHA256SUMS) with the given image body.
func catalogFixture(body []byte) map[string][]byte {
	other := []byte("some other image")
	return map[string][]byte{
		"/mirror/bookworm/latest/debian-12-genericcloud-amd64.qcow2": body,
		"/mirror/bookworm/latest/SHA512SUMS": []byte(fmt.Sprintf("%s  debian-12-genericcloud-arm64.qcow2\n%s  debian-12-genericcloud-amd64.qcow2\n",
			hexSHA512(other), hexSHA512(body))),
		"/mirror/noble/current/noble-server-cloudimg-amd64.img": body,
		"/mirror/noble/current/SHA256SUMS": []byte(fmt.Sprintf("%s *noble-server-cloudimg-arm64.img\n%s *noble-server-cloudimg-amd64.img\n",
			hexSHA256(other), hexSHA256(body))),
	}
}

func TestPullCatalog(t *testing.T) {
	ctx := context.Background()
	body := []byte(strings.Repeat("cloud image bytes ", 20000))

	for _, tt := range []struct {
		name, image, sums string
	}{
		{"debian-12", "/mirror/bookworm/latest/debian-12-genericcloud-amd64.qcow2", "/mirror/bookworm/latest/SHA512SUMS"},
		{"ubuntu-24.04", "/mirror/noble/current/noble-server-cloudimg-amd64.img", "/mirror/noble/current/SHA256SUMS"},
	} {
		t.Run("good "+tt.name, func(t *testing.T) {
			m := mirror{files: catalogFixture(body)}
			var mu sync.Mutex
			var requests []string
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				mu.Lock()
				requests = append(requests, r.URL.Path)
				mu.Unlock()
				m.ServeHTTP(w, r)
			}))
			defer srv.Close()
			entry, err := LookupCatalog(tt.name)
			if err != nil {
				t.Fatal(err)
			}
			s := NewStore(t.TempDir(), &fakeRunner{}, srv.Client())
			var stages []string
			var done, total int64
			// Signatures are TestPullCatalogSignature's: here a signed
			// entry is taken --unsigned.
			img, err := s.PullCatalog(ctx, tt.name, entry, CatalogPull{Mirror: srv.URL + "/mirror/", Unsigned: entry.Signature != nil}, func(stage string, d, tot int64) {
				if len(stages) == 0 || stages[len(stages)-1] != stage {
					stages = append(stages, stage)
				}
				if stage == "download" {
					done, total = d, tot
				}
			})
			if err != nil {
				t.Fatal(err)
			}
			mu.Lock()
			defer mu.Unlock()
			if want := []string{tt.sums, tt.image}; strings.Join(requests, " ") != strings.Join(want, " ") {
				t.Errorf("requests = %q, want %q (checksums first)", requests, want)
			}
			if img.Source != srv.URL+tt.image || img.SourceSHA256 != hexSHA256(body) {
				t.Errorf("metadata source = %s %s, want %s and the download's sha256", img.Source, img.SourceSHA256, srv.URL+tt.image)
			}
			if got, want := strings.Join(stages, ","), "checksums,download,import"; got != want {
				t.Errorf("progress stages = %s, want %s", got, want)
			}
			if done != int64(len(body)) || total != int64(len(body)) {
				t.Errorf("last download progress %d/%d, want %d/%d", done, total, len(body), len(body))
			}
			if got := leftovers(t, s); len(got) != 1 || got[0] != tt.name {
				t.Errorf("images dir holds %q, want only %s", got, tt.name)
			}
		})
	}

	tampered := append([]byte(nil), body...)
	tampered[len(tampered)/2] ^= 1
	huge := []byte(strings.Repeat(hexSHA512(body)+"  filler.qcow2\n", MaxSumsSize/140+1))
	const sums = "/mirror/bookworm/latest/SHA512SUMS"
	const img = "/mirror/bookworm/latest/debian-12-genericcloud-amd64.qcow2"
	bad := []struct {
		name    string
		change  func(files map[string][]byte)
		chunked bool
		want    []string
	}{
		{"checksum mismatch", func(f map[string][]byte) { f[img] = tampered }, false,
			[]string{"checksum mismatch", "expected sha512 " + hexSHA512(body), "got " + hexSHA512(tampered)}},
		{"sums file without the entry", func(f map[string][]byte) {
			f[sums] = []byte(hexSHA512(body) + "  debian-12-genericcloud-arm64.qcow2\n")
		}, false, []string{"no sha512 for debian-12-genericcloud-amd64.qcow2"}},
		{"ambiguous sums file", func(f map[string][]byte) {
			f[sums] = append(f[sums], hexSHA512(tampered)+"  debian-12-genericcloud-amd64.qcow2\n"...)
		}, false, []string{"2 different sha512 sums"}},
		{"oversized sums file", func(f map[string][]byte) { f[sums] = huge }, false, []string{"limit of 1048576"}},
		{"oversized sums file, no length", func(f map[string][]byte) { f[sums] = huge }, true, []string{"limit of 1048576"}},
		{"sums 404", func(f map[string][]byte) { delete(f, sums) }, false, []string{"fetching checksums", "404"}},
		{"image 404", func(f map[string][]byte) { delete(f, img) }, false, []string{"downloading", "404"}},
		{"truncated image served whole", func(f map[string][]byte) { f[img] = body[:len(body)-1] }, false, []string{"checksum mismatch"}},
	}
	for _, tt := range bad {
		t.Run(tt.name, func(t *testing.T) {
			files := catalogFixture(body)
			tt.change(files)
			srv := httptest.NewServer(mirror{files: files, chunked: tt.chunked})
			defer srv.Close()
			entry, err := LookupCatalog("debian-12")
			if err != nil {
				t.Fatal(err)
			}
			run := &fakeRunner{}
			s := NewStore(t.TempDir(), run, srv.Client())
			_, err = s.PullCatalog(ctx, "debian-12", entry, CatalogPull{Mirror: srv.URL + "/mirror"}, nil)
			for _, w := range tt.want {
				if err == nil || !strings.Contains(err.Error(), w) {
					t.Errorf("PullCatalog = %v, want error containing %q", err, w)
				}
			}
			if got := leftovers(t, s); len(got) != 0 {
				t.Errorf("images dir holds %q after a failed pull, want nothing", got)
			}
			if len(run.calls) != 0 {
				t.Errorf("ran %q, want nothing run for an unverified image", run.calls)
			}
		})
	}
}

func TestPullChecksumSHA512(t *testing.T) {
	body := []byte("a small image")
	srv := httptest.NewServer(mirror{files: map[string][]byte{"/x.img": body}})
	defer srv.Close()
	ctx := context.Background()
	for _, tt := range []struct {
		name, sum, wantErr string
	}{
		{"good", strings.ToUpper(hexSHA512(body)), ""},
		{"mismatch", hexSHA512([]byte("another")), "checksum mismatch"},
		{"sha256 given as sha512", hexSHA256(body), "not a hex sha512"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := NewStore(t.TempDir(), &fakeRunner{}, srv.Client())
			img, err := s.PullChecksum(ctx, "x", srv.URL+"/x.img", Checksum{SHA512, tt.sum}, nil)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Errorf("PullChecksum = %v, want error containing %q", err, tt.wantErr)
				}
				if got := leftovers(t, s); len(got) != 0 {
					t.Errorf("images dir holds %q after a failed pull, want nothing", got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if img.SourceSHA256 != hexSHA256(body) {
				t.Errorf("SourceSHA256 = %s, want the download's sha256 %s", img.SourceSHA256, hexSHA256(body))
			}
		})
	}
}
