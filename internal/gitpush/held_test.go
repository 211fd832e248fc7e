package gitpush

import "testing"

func TestHeld(t *testing.T) {
	for _, tc := range []struct {
		method, path string
		want         bool
	}{
		{"POST", "/acme/app.git/git-receive-pack", true},
		{"post", "/acme/app.git/git-receive-pack", true},
		{"PUT", "/acme/app.git/GIT-RECEIVE-PACK", true},
		{"POST", "/acme/app.git/git%2dreceive%2Dpack", true},
		{"POST", "/x/git-receive-pack/y", true},
		{"GET", "/acme/app.git/git-receive-pack", false},
		{"HEAD", "/acme/app.git/git-receive-pack", false},
		{"POST", "/acme/app.git/git-upload-pack", false},
		{"POST", "/repos/acme/app/pulls", false},
	} {
		if got := Held(tc.method, tc.path); got != tc.want {
			t.Errorf("Held(%s, %s) = %v, want %v", tc.method, tc.path, got, tc.want)
		}
	}
}
