package image_test

import (
	"bytes"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/abox-dev/abox/internal/cli"
	"github.com/abox-dev/abox/internal/image"
	"github.com/abox-dev/abox/internal/testutil/need"
)

// These tests drive `abox base pull` through cli.Main against a local
// mirror serving a real qcow2, so they run the real qemu-img. They live here
// rather than in internal/cli because the pull command is the adapter over
// this package's catalogue.

// qcow2 returns the bytes of a small real qcow2 made by qemu-img.
func qcow2(t *testing.T) []byte {
	t.Helper()
	need.Program(t, "qemu-img")
	f := filepath.Join(t.TempDir(), "x.qcow2")
	if out, err := exec.Command("qemu-img", "create", "-f", "qcow2", f, "16M").CombinedOutput(); err != nil {
		t.Fatalf("qemu-img create: %v: %s", err, out)
	}
	b, err := os.ReadFile(f)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// serveMirror serves an upstream copy of debian-12 (SHA512SUMS) and
// ubuntu-24.04 (SHA256SUMS, signed by signer when it is not nil) whose
// images are body and whose sums vouch for vouched, under /m.
func serveMirror(t *testing.T, body, vouched []byte, signer *image.TestSigner) string {
	t.Helper()
	s512 := sha512.Sum512(vouched)
	s256 := sha256.Sum256(vouched)
	files := map[string][]byte{
		"/m/bookworm/latest/debian-12-genericcloud-amd64.qcow2": body,
		"/m/bookworm/latest/SHA512SUMS":                         []byte(hex.EncodeToString(s512[:]) + "  debian-12-genericcloud-amd64.qcow2\n"),
		"/m/noble/current/noble-server-cloudimg-amd64.img":      body,
		"/m/noble/current/SHA256SUMS":                           []byte(hex.EncodeToString(s256[:]) + " *noble-server-cloudimg-amd64.img\n"),
	}
	if signer != nil {
		files["/m/noble/current/SHA256SUMS.gpg"] = signer.Sign(files["/m/noble/current/SHA256SUMS"])
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, ok := files[r.URL.Path]
		if !ok {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Length", strconv.Itoa(len(b)))
		w.Write(b)
	}))
	t.Cleanup(srv.Close)
	return srv.URL + "/m"
}

// abox runs the CLI with ABOX_HOME at home and returns exit code, stdout, stderr.
func abox(t *testing.T, home string, args ...string) (int, string, string) {
	t.Helper()
	t.Setenv("ABOX_HOME", home)
	var stdout, stderr bytes.Buffer
	code := cli.Main(args, strings.NewReader(""), &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

func imagesIn(t *testing.T, home string) []string {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(home, "images"))
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

func TestCLIBasePull(t *testing.T) {
	disk := qcow2(t)
	signer := image.NewTestSigner(t, "abox test signer <signer@abox.invalid>")
	mirror := serveMirror(t, disk, disk, signer)

	t.Run("catalogue sha512 and sha256", func(t *testing.T) {
		home := t.TempDir()
		t.Setenv(image.EnvMirror, mirror)
		code, _, stderr := abox(t, home, "base", "pull", "debian-12")
		if code != 0 {
			t.Fatalf("pull debian-12: exit %d, stderr:\n%s", code, stderr)
		}
		for _, want := range []string{"checksums\n", "download: 100%", "import\n", "pulled debian-12 (16 MiB), sha512 verified against " + mirror + "/bookworm/latest/SHA512SUMS"} {
			if !strings.Contains(stderr, want) {
				t.Errorf("stderr lacks %q:\n%s", want, stderr)
			}
		}
		t.Setenv(image.EnvMirror, "http://127.0.0.1:1/unused")
		code, _, stderr = abox(t, home, "base", "pull", "ubuntu-24.04", "--mirror", mirror, "--keyring", signer.Keyring)
		if code != 0 || !strings.Contains(stderr, "sha256 verified") || !strings.Contains(stderr, "signed by "+signer.Fingerprint) {
			t.Fatalf("pull ubuntu-24.04 --mirror: exit %d, stderr:\n%s", code, stderr)
		}
		code, stdout, stderr := abox(t, home, "base", "list", "--json")
		if code != 0 {
			t.Fatalf("base list: exit %d: %s", code, stderr)
		}
		var imgs []image.Image
		if err := json.Unmarshal([]byte(stdout), &imgs); err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(disk)
		if len(imgs) != 2 || imgs[0].Name != "debian-12" || imgs[1].Name != "ubuntu-24.04" {
			t.Fatalf("base list = %+v, want debian-12 and ubuntu-24.04", imgs)
		}
		if imgs[0].VirtualSize != 16<<20 || imgs[0].SourceSHA256 != hex.EncodeToString(sum[:]) || imgs[0].Source != mirror+"/bookworm/latest/debian-12-genericcloud-amd64.qcow2" {
			t.Errorf("debian-12 metadata = %+v, want 16 MiB, the mirror URL and the download's sha256", imgs[0].Metadata)
		}
		if imgs[0].Signed || !imgs[1].Signed || imgs[1].SignedBy != signer.Fingerprint {
			t.Errorf("base list --json: debian-12 signed=%v, ubuntu-24.04 signed=%v by %q; want only ubuntu-24.04, by %s", imgs[0].Signed, imgs[1].Signed, imgs[1].SignedBy, signer.Fingerprint)
		}
		// base list says what vouched for each entry, and never claims a
		// signature abox did not check.
		code, stdout, _ = abox(t, home, "base", "list")
		lines := strings.Split(stdout, "\n")
		if code != 0 || len(lines) < 3 || !strings.Contains(lines[0], "VERIFIED") ||
			!strings.Contains(lines[1], "debian-12") || !strings.Contains(lines[1], "checksum not signature-checked: Debian publishes no signature") ||
			!strings.Contains(lines[2], "ubuntu-24.04") || !strings.Contains(lines[2], "signature by "+signer.Fingerprint) || strings.Contains(lines[2], "not signature-checked") {
			t.Errorf("base list = %d:\n%s\nwant debian-12 marked not signature-checked and ubuntu-24.04 signed", code, stdout)
		}
		code, _, stderr = abox(t, home, "base", "pull", "debian-12", "--mirror", mirror)
		if code != 1 || !strings.Contains(stderr, "exists") {
			t.Errorf("second pull: exit %d, stderr %q; want 1 and already exists", code, stderr)
		}
	})

	t.Run("checksum mismatch leaves nothing", func(t *testing.T) {
		home := t.TempDir()
		bad := serveMirror(t, disk, []byte("something else"), nil)
		code, _, stderr := abox(t, home, "base", "pull", "debian-12", "--mirror", bad)
		if code != 1 || !strings.Contains(stderr, "checksum mismatch") || !strings.Contains(stderr, "expected sha512") {
			t.Errorf("exit %d, stderr %q; want 1 and a checksum mismatch", code, stderr)
		}
		if got := imagesIn(t, home); len(got) != 0 {
			t.Errorf("images dir holds %q, want nothing", got)
		}
	})

	t.Run("explicit URL and sha512", func(t *testing.T) {
		home := t.TempDir()
		sum := sha512.Sum512(disk)
		code, _, stderr := abox(t, home, "base", "pull", "mine", mirror+"/bookworm/latest/debian-12-genericcloud-amd64.qcow2", "--sha512", hex.EncodeToString(sum[:]))
		if code != 0 || !strings.Contains(stderr, "pulled mine (16 MiB), sha512 verified") {
			t.Errorf("exit %d, stderr:\n%s", code, stderr)
		}
		if _, stdout, _ := abox(t, home, "base", "list"); !strings.Contains(stdout, "sha512 given on the command line; no signature") {
			t.Errorf("base list:\n%s\nwant the entry marked as verified by the given sha512", stdout)
		}
	})

	t.Run("list", func(t *testing.T) {
		code, stdout, stderr := abox(t, t.TempDir(), "base", "pull", "--list", "--mirror", mirror)
		if code != 0 {
			t.Fatalf("exit %d: %s", code, stderr)
		}
		for _, name := range image.CatalogNames() {
			if !strings.Contains(stdout, name) {
				t.Errorf("--list lacks %s:\n%s", name, stdout)
			}
		}
		if !strings.Contains(stdout, mirror+"/noble/current/noble-server-cloudimg-amd64.img") {
			t.Errorf("--list does not show the mirrored URL:\n%s", stdout)
		}
	})
}

func TestCLIBasePullArgs(t *testing.T) {
	sha := strings.Repeat("a", 64)
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"no arguments", nil, "takes a catalogue NAME, or a NAME and a URL"},
		{"three arguments", []string{"a", "http://x/a", "b"}, "got 3 arguments"},
		{"unknown catalogue name", []string{"fedora-40"}, "known: " + strings.Join(image.CatalogNames(), ", ")},
		{"catalogue name with a checksum", []string{"debian-12", "--sha256", sha}, "go with a URL"},
		{"URL without a checksum", []string{"mine", "http://x/a"}, "--sha256 or --sha512 is required"},
		{"URL with both checksums", []string{"mine", "http://x/a", "--sha256", sha, "--sha512", sha + sha}, "not both"},
		{"URL with a short sha512", []string{"mine", "http://x/a", "--sha512", sha}, "not a hex sha512"},
		{"URL with a mirror", []string{"mine", "http://x/a", "--sha256", sha, "--mirror", "http://m"}, "--mirror goes with a catalogue name"},
		{"list with a name", []string{"--list", "debian-12"}, "no arguments with --list"},
		{"json without list", []string{"debian-12", "--json"}, "--json goes with --list"},
		{"mirror not http", []string{"debian-12", "--mirror", "ftp://m"}, "want an https:// URL"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv(image.EnvMirror, "")
			home := t.TempDir()
			code, stdout, stderr := abox(t, home, append([]string{"base", "pull"}, tt.args...)...)
			if code != 2 || !strings.Contains(stderr, tt.want) {
				t.Errorf("abox base pull %s: exit %d, stderr %q; want exit 2 and %q", strings.Join(tt.args, " "), code, stderr, tt.want)
			}
			if stdout != "" {
				t.Errorf("stdout = %q, want nothing", stdout)
			}
			if got := imagesIn(t, home); len(got) != 0 {
				t.Errorf("images dir holds %q, want nothing", got)
			}
		})
	}
}
