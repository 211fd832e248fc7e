package decisionlog

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"math"
	"net/netip"
	"strings"
	"testing"
	"time"
)

// slogLine is what log/slog's JSON handler writes for the same record: the
// format the encoder must keep.
func slogLine(t testing.TB, tm time.Time, level slog.Level, msg string, attrs ...slog.Attr) string {
	t.Helper()
	var b bytes.Buffer
	r := slog.NewRecord(tm, level, msg, 0)
	r.AddAttrs(attrs...)
	if err := slog.NewJSONHandler(&b, nil).Handle(context.Background(), r); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

func encodeString(s string) string { return string(appendString(nil, s)) }

var strCases = []struct{ name, in string }{
	{"empty", ""},
	{"plain", "www.example.com"},
	{"quote and backslash", `a"b\c`},
	{"newline forging a line", "x\n{\"verdict\":\"allow\"}"},
	{"cr tab", "a\rb\tc"},
	{"nul", "exa\x00mple"},
	{"all C0 controls", "\x01\x02\x03\x04\x05\x06\x07\x08\x0b\x0c\x0e\x0f\x10\x1f"},
	{"del", "a\x7fb"},
	{"html", "<script>&amp;</script>"},
	{"utf-8", "bücher.com ＥＸＡＭＰＬＥ 𝔘"},
	{"line and paragraph separators", "a\u2028b\u2029c"},
	{"invalid byte", "a\xffb"},
	{"lone continuation", "\x80"},
	{"truncated rune", "ab\xe2\x82"},
	{"surrogate half", "\xed\xa0\x80"},
	{"overlong slash", "\xc0\xaf"},
	{"escape at end", "abc\""},
}

// TestString: every string encodes as slog's JSON handler would, decodes
// back to itself (invalid bytes as U+FFFD) and stays on one line.
func TestString(t *testing.T) {
	for _, tc := range strCases {
		t.Run(tc.name, func(t *testing.T) {
			checkString(t, tc.in)
		})
	}
}

func checkString(t *testing.T, in string) {
	t.Helper()
	got := encodeString(in)
	tm := time.Unix(0, 0).UTC()
	want := slogLine(t, tm, slog.LevelInfo, "m", slog.String("k", in))
	prefix := `{"time":"1970-01-01T00:00:00Z","level":"INFO","msg":"m","k":`
	if !strings.HasPrefix(want, prefix) {
		t.Fatalf("slog wrote %q, want prefix %q", want, prefix)
	}
	if w := strings.TrimSuffix(strings.TrimPrefix(want, prefix), "}\n"); got != w {
		t.Errorf("appendString(%q) = %s, slog writes %s", in, got, w)
	}
	var back string
	if err := json.Unmarshal([]byte(got), &back); err != nil {
		t.Fatalf("appendString(%q) = %s: not JSON: %v", in, got, err)
	}
	// Converting to runes turns each invalid byte into one U+FFFD, as the encoder does.
	if want := string([]rune(in)); back != want {
		t.Errorf("appendString(%q) decodes to %q, want %q", in, back, want)
	}
	if strings.ContainsAny(got, "\n\r") {
		t.Errorf("appendString(%q) = %q holds a raw line break", in, got)
	}
}

func FuzzString(f *testing.F) {
	for _, tc := range strCases {
		f.Add(tc.in)
	}
	f.Fuzz(func(t *testing.T, in string) { checkString(t, in) })
}

var floatCases = []float64{0, math.Copysign(0, -1), 0.001, 0.31, 1, 12.5, 123456.789, 1e-6, 9.99e-7, 1e-7, 1.5e-300,
	1e20, 1e21, 1.7976931348623157e308, 5e-324, -2.5, -1e-9}

// TestFloat: numbers are written as encoding/json writes them.
func TestFloat(t *testing.T) {
	for _, f := range floatCases {
		checkFloat(t, f)
	}
	for _, tc := range []struct {
		in   float64
		want string
	}{{math.NaN(), `"NaN"`}, {math.Inf(1), `"+Inf"`}, {math.Inf(-1), `"-Inf"`}} {
		if got := string(appendFloat(nil, tc.in)); got != tc.want {
			t.Errorf("appendFloat(%v) = %s, want %s", tc.in, got, tc.want)
		}
	}
}

func checkFloat(t *testing.T, f float64) {
	t.Helper()
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return
	}
	want, err := json.Marshal(f)
	if err != nil {
		t.Fatal(err)
	}
	if got := appendFloat(nil, f); string(got) != string(want) {
		t.Errorf("appendFloat(%v) = %s, json.Marshal gives %s", f, got, want)
	}
}

func FuzzFloat(f *testing.F) {
	for _, v := range floatCases {
		f.Add(math.Float64bits(v))
	}
	f.Fuzz(func(t *testing.T, bits uint64) { checkFloat(t, math.Float64frombits(bits)) })
}

// TestLineMatchesSlog: a whole line is byte for byte what slog writes for
// the same record, so switching encoders changes nothing for log readers.
func TestLineMatchesSlog(t *testing.T) {
	tm := time.Date(2025, 3, 4, 5, 6, 7, 890120000, time.FixedZone("X", 3600))
	for _, tc := range []struct {
		name  string
		level slog.Level
		addr  netip.Addr
		f     float64
	}{
		{"v4", slog.LevelInfo, netip.MustParseAddr("10.10.10.2"), 0.31},
		{"v6", slog.LevelWarn, netip.MustParseAddr("fd00::2"), 1500},
		{"v6 zone", slog.LevelInfo, netip.MustParseAddr("fe80::1%eth\"0"), 0},
		{"v4-mapped", slog.LevelInfo, netip.MustParseAddr("::ffff:10.0.0.1"), 0},
		{"invalid", slog.LevelError, netip.Addr{}, 1e-7},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := NewLine(tm, tc.level, "dns")
			l.Addr("client", tc.addr).String("name", "a\x00b\xff.example").Float("upstream_ms", tc.f).Bool("cached", true).Int("n", -42)
			got := string(l.finish())
			l.Free()
			want := slogLine(t, tm, tc.level, "dns", slog.String("client", tc.addr.String()), slog.String("name", "a\x00b\xff.example"),
				slog.Float64("upstream_ms", tc.f), slog.Bool("cached", true), slog.Int64("n", -42))
			if got != want {
				t.Errorf("line\n got %s\nwant %s", got, want)
			}
			if !json.Valid([]byte(got)) {
				t.Errorf("line %s is not valid JSON", got)
			}
		})
	}
}

// TestLineReuse: a recycled line starts empty.
func TestLineReuse(t *testing.T) {
	tm := time.Unix(1, 0).UTC()
	for range 3 {
		l := NewLine(tm, slog.LevelInfo, "m")
		got := string(l.String("k", "v").finish())
		l.Free()
		if want := `{"time":"1970-01-01T00:00:01Z","level":"INFO","msg":"m","k":"v"}` + "\n"; got != want {
			t.Fatalf("got %q, want %q", got, want)
		}
	}
}

// dnsLine is a typical DNS decision line.
func dnsLine(tm time.Time) *Line {
	l := NewLine(tm, slog.LevelInfo, "dns")
	l.Addr("client", netip.MustParseAddr("10.10.10.2")).String("name", "host123.blocked.test").String("type", "A").
		String("verdict", "block").String("reason", "not_allowlisted").String("rule", "").String("rcode", "NXDOMAIN").
		Float("upstream_ms", 0).Bool("cached", false)
	return l
}

// BenchmarkLine encodes a DNS decision line; BenchmarkSlogJSON does the same
// through log/slog's JSON handler, the encoder it replaces.
func BenchmarkLine(b *testing.B) {
	b.ReportAllocs()
	tm := time.Now()
	for b.Loop() {
		l := dnsLine(tm)
		l.finish()
		l.Free()
	}
}

func BenchmarkSlogJSON(b *testing.B) {
	b.ReportAllocs()
	log := slog.New(slog.NewJSONHandler(discard{}, nil))
	ctx := context.Background()
	client := netip.MustParseAddr("10.10.10.2")
	for b.Loop() {
		log.LogAttrs(ctx, slog.LevelInfo, "dns",
			slog.String("client", client.String()), slog.String("name", "host123.blocked.test"), slog.String("type", "A"),
			slog.String("verdict", "block"), slog.String("reason", "not_allowlisted"), slog.String("rule", ""),
			slog.String("rcode", "NXDOMAIN"), slog.Float64("upstream_ms", 0), slog.Bool("cached", false))
	}
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

// TestTimeAsSlogWritesIt: a line's time is written as time.RFC3339Nano
// formats it (the layout slog uses), whatever the nanoseconds (trailing
// zeros, none), the zone (UTC, offsets, a DST change) and the order of
// the times (a second formatted before is not reused for another).
func TestTimeAsSlogWritesIt(t *testing.T) {
	paris, err := time.LoadLocation("Europe/Paris")
	if err != nil {
		paris = time.FixedZone("CET", 3600)
	}
	base := []time.Time{
		time.Date(2026, 12, 1, 21, 22, 38, 363094634, time.UTC),
		time.Date(2026, 12, 1, 21, 22, 38, 0, time.UTC),
		time.Date(2026, 12, 1, 21, 22, 38, 500000000, time.UTC),
		time.Date(2026, 12, 1, 21, 22, 38, 10, time.UTC),
		time.Date(2026, 3, 29, 1, 59, 59, 999999999, time.UTC).In(paris), // the DST change
		time.Date(2026, 3, 29, 2, 0, 0, 1, time.UTC).In(paris),
		time.Date(2026, 12, 1, 21, 22, 38, 363094634, time.FixedZone("", -(9*3600+30*60))),
		time.Date(9999, 12, 31, 23, 59, 59, 999999999, time.UTC),
		time.Now(),
	}
	var times []time.Time
	for _, tm := range base {
		// The same second in another zone, the next nanosecond, another
		// second, and the first again.
		times = append(times, tm, tm.In(time.FixedZone("", 5*3600)), tm.Add(time.Nanosecond), tm.Add(time.Second), tm)
	}
	for _, tm := range times {
		l := NewLine(tm, slog.LevelInfo, "dns")
		want := `{"time":"` + tm.Format(time.RFC3339Nano) + `"`
		if got := string(l.buf[:len(want)]); got != want {
			t.Errorf("%v: line starts %s, want %s", tm, got, want)
		}
		l.Free()
	}
}

// BenchmarkTime: a line's time, formatted by appendTime and by
// time.AppendFormat.
func BenchmarkTime(b *testing.B) {
	tm := time.Now()
	buf := make([]byte, 0, 64)
	b.Run("appendTime", func(b *testing.B) {
		for b.Loop() {
			buf = appendTime(buf[:0], tm)
		}
	})
	b.Run("AppendFormat", func(b *testing.B) {
		for b.Loop() {
			buf = tm.AppendFormat(buf[:0], time.RFC3339Nano)
		}
	})
}
