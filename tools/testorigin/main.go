// Command testorigin is a small origin server for abox's demo and VM
// end-to-end tests: it answers HTTP and HTTPS (with a certificate from a CA it
// writes to --ca-out) with a fixed body naming the request, so tests can tell
// which origin answered and what reached it.
package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"flag"
	"fmt"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/http/cgi"
	"os"
	"strconv"
	"strings"
	"time"
)

func main() {
	httpAddr := flag.String("http", ":80", "plain HTTP listen address (empty: none)")
	httpsAddr := flag.String("https", ":443", "HTTPS listen address (empty: none)")
	names := flag.String("names", "localhost", "comma-separated DNS names and IPs for the certificate")
	caOut := flag.String("ca-out", "", "write the CA certificate (PEM) here")
	body := flag.String("body", "hello from testorigin", "response body prefix")
	h1 := flag.Bool("http1", false, "HTTPS offers HTTP/1.1 only (no h2)")
	gitHost := flag.String("git-host", "", "requests for this host are git's smart HTTP (git http-backend), reads and pushes")
	gitRoot := flag.String("git-root", "", "the directory of the bare repositories --git-host serves")
	tokenHost := flag.String("token-host", "", "requests for this host need Authorization: Bearer and the token in --token-file (401 otherwise): a stand-in API for injected secrets")
	gitTokenFile := flag.String("git-push-token-file", "", "with --git-host, pushes (POST git-receive-pack) need Authorization: Basic with the token in this file as the password (401 otherwise; read at every request)")
	tokenFile := flag.String("token-file", "", "the file holding --token-host's token, read at every request (so it can be written, or rotated, after the start)")
	flag.Parse()
	if (*tokenHost == "") != (*tokenFile == "") {
		log.Fatal("--token-host and --token-file go together: name the host and the file holding its token")
	}

	var git http.Handler
	if *gitHost != "" {
		git = gitBackend(*gitRoot)
	}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if git != nil && hostOnly(r.Host) == *gitHost {
			if *gitTokenFile != "" && isReceivePack(r) {
				if why := checkAuth(r, *gitTokenFile, basicPassword); why != "" {
					w.Header().Set("WWW-Authenticate", `Basic realm="code"`)
					http.Error(w, "testorigin: "+why, http.StatusUnauthorized)
					return
				}
			}
			git.ServeHTTP(w, r)
			return
		}
		if *tokenHost != "" && hostOnly(r.Host) == *tokenHost {
			if why := checkAuth(r, *tokenFile, bearer); why != "" {
				w.Header().Set("WWW-Authenticate", "Bearer")
				http.Error(w, "testorigin: "+why, http.StatusUnauthorized)
				return
			}
		}
		if n, ok := strings.CutPrefix(r.URL.Path, "/bytes/"); ok {
			serveBytes(w, n)
			return
		}
		w.Header().Set("Content-Type", "text/plain")
		fmt.Fprintf(w, "%s: %s %s host=%s proto=%s\n", *body, r.Method, r.URL.Path, r.Host, r.Proto)
	})
	errc := make(chan error, 2)
	if *httpAddr != "" {
		ln, err := net.Listen("tcp", *httpAddr)
		if err != nil {
			log.Fatal(err)
		}
		go func() { errc <- http.Serve(ln, h) }()
	}
	if *httpsAddr != "" {
		cert, caPEM, err := makeCert(strings.Split(*names, ","))
		if err != nil {
			log.Fatal(err)
		}
		if *caOut != "" {
			if err := os.WriteFile(*caOut, caPEM, 0o644); err != nil {
				log.Fatal(err)
			}
		}
		ln, err := tls.Listen("tcp", *httpsAddr, &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: protos(*h1)})
		if err != nil {
			log.Fatal(err)
		}
		srv := &http.Server{Handler: h}
		go func() { errc <- srv.Serve(ln) }()
	}
	fmt.Fprintln(os.Stderr, "testorigin: ready")
	log.Fatal(<-errc)
}

// gitBackend serves the bare repositories under root as a code host does
// (clone, fetch and push over smart HTTP), so that what a request rule
// lets through is seen by a real git server.
func gitBackend(root string) http.Handler {
	return &cgi.Handler{
		Path: "/usr/bin/git",
		Args: []string{"http-backend"},
		Env:  []string{"GIT_PROJECT_ROOT=" + root, "GIT_HTTP_EXPORT_ALL=1"},
	}
}

// checkAuth returns why r does not carry exactly one Authorization header
// whose credential (as cred reads it) is the token in file, or "" when it
// does. The answer never repeats what the request sent, nor the token.
func checkAuth(r *http.Request, file string, cred func(string) string) string {
	b, err := os.ReadFile(file)
	want := strings.TrimSpace(string(b))
	if err != nil || want == "" {
		return "no token to check against (write one to the token file)"
	}
	got := r.Header.Values("Authorization")
	switch {
	case len(got) == 0:
		return "no Authorization header"
	case len(got) > 1:
		return "more than one Authorization header"
	case subtle.ConstantTimeCompare([]byte(cred(got[0])), []byte(want)) != 1:
		return "wrong token"
	}
	return ""
}

// bearer is the token of "Bearer TOKEN" ("" for anything else).
func bearer(h string) string {
	t, ok := strings.CutPrefix(h, "Bearer ")
	if !ok {
		return ""
	}
	return t
}

// basicPassword is the password of "Basic base64(user:password)".
func basicPassword(h string) string {
	r := http.Request{Header: http.Header{"Authorization": {h}}}
	_, pw, ok := r.BasicAuth()
	if !ok {
		return ""
	}
	return pw
}

// isReceivePack reports whether r is a push itself (the ref updates and
// the pack). Its advertisement (info/refs?service=git-receive-pack) needs
// no token, so that a push refused by the proxy is refused there, not by a
// 401 from here.
func isReceivePack(r *http.Request) bool {
	return strings.HasSuffix(r.URL.Path, "/git-receive-pack")
}

func hostOnly(hostport string) string {
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		return h
	}
	return hostport
}

func protos(h1 bool) []string {
	if h1 {
		return []string{"http/1.1"}
	}
	return []string{"h2", "http/1.1"}
}

// maxBytes caps /bytes/N.
const maxBytes = 1 << 30

var zeros = make([]byte, 256<<10)

// serveBytes answers /bytes/N with N zero bytes and their Content-Length,
// for throughput benchmarks.
func serveBytes(w http.ResponseWriter, n string) {
	size, err := strconv.ParseInt(n, 10, 64)
	if err != nil || size < 0 || size > maxBytes {
		http.Error(w, "/bytes/N takes N from 0 to 1073741824", http.StatusBadRequest)
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(size, 10))
	for size > 0 {
		b := zeros[:min(size, int64(len(zeros)))]
		if _, err := w.Write(b); err != nil {
			return
		}
		size -= int64(len(b))
	}
}

func makeCert(names []string) (tls.Certificate, []byte, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "testorigin CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	caCert, _ := x509.ParseCertificate(caDER)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	leaf := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: names[0]},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, KeyUsage: x509.KeyUsageDigitalSignature,
	}
	for _, n := range names {
		if ip := net.ParseIP(n); ip != nil {
			leaf.IPAddresses = append(leaf.IPAddresses, ip)
		} else {
			leaf.DNSNames = append(leaf.DNSNames, n)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, leaf, caCert, &key.PublicKey, caKey)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key},
		pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), nil
}
