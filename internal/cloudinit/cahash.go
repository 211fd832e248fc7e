package cloudinit

import (
	"bytes"
	"crypto/sha1" //nolint:gosec // OpenSSL's directory lookup names files by a SHA-1 of the subject; nothing is signed with it
	"crypto/x509"
	"encoding/asn1"
	"encoding/binary"
	"encoding/pem"
	"fmt"
	"sort"
	"strings"
	"unicode/utf8"
)

// The guest's OpenSSL (Python's ssl module, openssl s_client, anything that
// calls SSL_CTX_set_default_verify_paths) finds a CA in /etc/ssl/certs by
// the file name <subject hash>.0, not through the bundle. update-ca-certificates
// makes those names by running openssl rehash over every certificate, which
// is what made cloud-init's ca_certs module take half a minute under TCG.
// abox computes the one name itself so the seed can write the file and no
// program runs at boot.

// subjectHash is OpenSSL's X509_NAME_hash (the "new" hash since 1.0.0, what
// `openssl x509 -hash` prints): the first four bytes, little-endian, of the
// SHA-1 of the subject's canonical encoding.
func subjectHash(cert *x509.Certificate) (string, error) {
	canon, err := canonicalName(cert.RawSubject)
	if err != nil {
		return "", fmt.Errorf("hashing the subject of %q: %w", cert.Subject, err)
	}
	sum := sha1.Sum(canon) //nolint:gosec // see above
	return fmt.Sprintf("%08x", binary.LittleEndian.Uint32(sum[:4])), nil
}

// canonicalName is OpenSSL's x509_name_canon: every text value becomes a
// UTF8String, lowercased (ASCII only), trimmed, with runs of white space
// collapsed to one space; other values stay as they are. The result is the
// DER of each RDN's SET, concatenated, without the outer SEQUENCE header.
func canonicalName(rawSubject []byte) ([]byte, error) {
	// Read the values raw: pkix's parsed form loses the string type.
	var raw []asn1.RawValue
	rest, err := asn1.Unmarshal(rawSubject, &raw)
	if err != nil {
		return nil, err
	}
	if len(rest) != 0 {
		return nil, fmt.Errorf("trailing data after the subject")
	}
	var out []byte
	for _, set := range raw {
		var atvs []struct {
			Type  asn1.ObjectIdentifier
			Value asn1.RawValue
		}
		if _, err := asn1.UnmarshalWithParams(set.FullBytes, &atvs, "set"); err != nil {
			return nil, err
		}
		// Each attribute canonicalised, then the SET re-encoded in DER
		// order (OpenSSL sorts the canonical encodings the same way).
		elems := make([][]byte, 0, len(atvs))
		for _, a := range atvs {
			v := a.Value
			if s, ok := textValue(v); ok {
				b, err := asn1.MarshalWithParams(canonicalText(s), "utf8")
				if err != nil {
					return nil, err
				}
				v = asn1.RawValue{FullBytes: b}
			}
			e, err := asn1.Marshal(struct {
				Type  asn1.ObjectIdentifier
				Value asn1.RawValue
			}{a.Type, v})
			if err != nil {
				return nil, err
			}
			elems = append(elems, e)
		}
		sort.Slice(elems, func(i, j int) bool { return derLess(elems[i], elems[j]) })
		b, err := asn1.Marshal(asn1.RawValue{Class: asn1.ClassUniversal, Tag: asn1.TagSet, IsCompound: true, Bytes: bytes.Join(elems, nil)})
		if err != nil {
			return nil, err
		}
		out = append(out, b...)
	}
	return out, nil
}

// derLess orders SET OF elements as DER does: as octet strings, the
// shorter one padded with zero bytes.
func derLess(a, b []byte) bool {
	n := max(len(a), len(b))
	for i := 0; i < n; i++ {
		var x, y byte
		if i < len(a) {
			x = a[i]
		}
		if i < len(b) {
			y = b[i]
		}
		if x != y {
			return x < y
		}
	}
	return false
}

// textValue decodes the string types OpenSSL canonicalises
// (ASN1_MASK_CANON): UTF8String, PrintableString, T61String, IA5String,
// VisibleString, UniversalString and BMPString.
func textValue(v asn1.RawValue) (string, bool) {
	if v.Class != asn1.ClassUniversal {
		return "", false
	}
	switch v.Tag {
	case asn1.TagUTF8String, asn1.TagPrintableString, asn1.TagIA5String, 26 /* VisibleString */ :
		if !utf8.Valid(v.Bytes) {
			return "", false
		}
		return string(v.Bytes), true
	case asn1.TagT61String:
		// OpenSSL reads T61 as Latin-1.
		var b strings.Builder
		for _, c := range v.Bytes {
			b.WriteRune(rune(c))
		}
		return b.String(), true
	case asn1.TagBMPString:
		if len(v.Bytes)%2 != 0 {
			return "", false
		}
		var b strings.Builder
		for i := 0; i < len(v.Bytes); i += 2 {
			b.WriteRune(rune(binary.BigEndian.Uint16(v.Bytes[i:])))
		}
		return b.String(), true
	case 28: // UniversalString
		if len(v.Bytes)%4 != 0 {
			return "", false
		}
		var b strings.Builder
		for i := 0; i < len(v.Bytes); i += 4 {
			b.WriteRune(rune(binary.BigEndian.Uint32(v.Bytes[i:])))
		}
		return b.String(), true
	}
	return "", false
}

// canonicalText trims, collapses white space and lowercases ASCII letters,
// as OpenSSL's asn1_string_canon does on the UTF-8 bytes.
func canonicalText(s string) string {
	isSpace := func(c byte) bool { return c == ' ' || (c >= '\t' && c <= '\r') }
	b := []byte(s)
	for len(b) > 0 && isSpace(b[0]) {
		b = b[1:]
	}
	for len(b) > 0 && isSpace(b[len(b)-1]) {
		b = b[:len(b)-1]
	}
	out := make([]byte, 0, len(b))
	for i := 0; i < len(b); i++ {
		c := b[i]
		if isSpace(c) {
			out = append(out, ' ')
			for i+1 < len(b) && isSpace(b[i+1]) {
				i++
			}
			continue
		}
		if c >= 'A' && c <= 'Z' {
			c += 'a' - 'A'
		}
		out = append(out, c)
	}
	return string(out)
}

// trustedCA is one CA certificate as the guest's trust store holds it.
type trustedCA struct {
	PEM  string // one CERTIFICATE block, newline-terminated
	Hash string // subjectHash, names /etc/ssl/certs/<Hash>.0
}

// splitCAs returns each certificate of a PEM bundle that checkCA accepted.
func splitCAs(pemText string) ([]trustedCA, error) {
	var out []trustedCA
	rest := []byte(pemText)
	for {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		cert, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return nil, fmt.Errorf("ca certificate: %w", err)
		}
		h, err := subjectHash(cert)
		if err != nil {
			return nil, err
		}
		out = append(out, trustedCA{PEM: string(pem.EncodeToMemory(b)), Hash: h})
	}
	return out, nil
}
