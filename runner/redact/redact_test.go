package redact

import (
	"fmt"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestString(t *testing.T) {
	r, err := New([]string{`ACME-[0-9]{6}`})
	require.NoError(t, err)
	r.AddLiteral("s3cr3t-installation-token-text")
	r.AddLiteral("abc") // too short: ignored
	cases := []struct{ name, in, want string }{
		{"installation token", "token ghs_16C7e42F292c6912E7710c838347Ae178B4a ok", "token [REDACTED] ok"},
		{"personal token", "ghp_abcdefghijklmnopqrstuvwxyz0123456789", Mask},
		{"fine-grained token", "github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz", Mask},
		{"taskrunner token", "Authorization: trt_live_abcdef0123456789", "Authorization: " + Mask},
		{"anthropic key", "ANTHROPIC_API_KEY=sk-ant-api03-abcdefghijklmnop-qrstuv", "ANTHROPIC_API_KEY=" + Mask},
		{"openai key", "sk-proj-abcdefghijklmnop1234", Mask},
		{"bearer", "Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.sig", "Authorization: Bearer " + Mask},
		{"basic", "Authorization: Basic eC1hY2Nlc3MtdG9rZW46Z2hzX3h4eHh4", "Authorization: Basic " + Mask},
		{"url credentials", "https://x-access-token:hunter2hunter2@github.com/o/r.git", "https://x-access-token:" + Mask + "@github.com/o/r.git"},
		{"pem", "key:\n-----BEGIN RSA PRIVATE KEY-----\nMIIEow\nabc\n-----END RSA PRIVATE KEY-----\nafter", "key:\n" + Mask + "\nafter"},
		{"cut pem", "-----BEGIN PRIVATE KEY-----\nMIIEow", Mask},
		{"literal", "clone with s3cr3t-installation-token-text failed", "clone with " + Mask + " failed"},
		{"configured pattern", "id ACME-123456 here", "id " + Mask + " here"},
		{"harmless text", "the token was refreshed; basic auth is off; abc", "the token was refreshed; basic auth is off; abc"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, r.String(tc.in))
		})
	}
}

func TestNewRejectsBadPattern(t *testing.T) {
	_, err := New([]string{"("})
	require.ErrorContains(t, err, `redact pattern "("`)
}

func TestStripANSIAndTruncate(t *testing.T) {
	require.Equal(t, "red bold\ttab", StripANSI("\x1b[31mred\x1b[0m \x1b[1mbold\x1b[0m\ttab\r"))
	require.Equal(t, "title", StripANSI("\x1b]0;x\x07title"))
	require.Equal(t, "abc", Truncate("abc", 5))
	got := Truncate(strings.Repeat("é", 10), 7)
	require.LessOrEqual(t, len(got), 7)
	require.True(t, strings.HasSuffix(got, "…"))
}

// TestTruncateShortLimits is the regression for Truncate(s, n) returning the 3-byte mark for
// n < 3, longer than asked.
func TestTruncateShortLimits(t *testing.T) {
	cases := []struct {
		s    string
		n    int
		want string
	}{
		{"abcdef", 0, ""},
		{"abcdef", 1, "a"},
		{"abcdef", 2, "ab"},
		{"abcdef", 3, "…"},
		{"abcdef", 4, "a…"},
		{"abcdef", -1, ""},
		{"éé", 1, ""}, // é is two bytes: no half rune
		{"éé", 3, "…"},
		{"éé", 5, "éé"},
		{"ééé", 5, "é…"},
		{"éé", 4, "éé"},
		{"日本語", 5, "…"},
		{"日本語", 6, "日…"},
		{"", 0, ""},
	}
	for _, tc := range cases {
		require.Equal(t, tc.want, Truncate(tc.s, tc.n), "Truncate(%q, %d)", tc.s, tc.n)
	}
}

func TestTruncateCounted(t *testing.T) {
	require.Equal(t, "short", TruncateCounted("short", 10))
	got := TruncateCounted(strings.Repeat("x", 3000), 2000)
	require.LessOrEqual(t, len(got), 2000)
	kept := strings.TrimRight(got, "… [truncated 1234567890bytes]")
	require.Equal(t, strings.Repeat("x", len(kept))+fmt.Sprintf("… [truncated %d bytes]", 3000-len(kept)), got)
	require.Greater(t, len(kept), 1950)

	got = TruncateCounted(strings.Repeat("é", 1000), 101)
	require.True(t, utf8.ValidString(got))
	require.LessOrEqual(t, len(got), 101)
	require.Contains(t, got, "[truncated ")

	require.Equal(t, "ab…", TruncateCounted("abcdefgh", 5), "no room for the count: a plain mark")
}

// checkTruncated asserts what every truncation promises: at most n bytes, s unchanged when it
// fits, otherwise a prefix of s and the mark, and valid UTF-8 kept valid.
func checkTruncated(t *testing.T, s string, n int, got, markPrefix string) {
	t.Helper()
	if len(s) <= n {
		require.Equal(t, s, got)
		return
	}
	require.LessOrEqual(t, len(got), max(n, 0))
	if utf8.ValidString(s) {
		require.True(t, utf8.ValidString(got), "%q cut to %d gave invalid UTF-8 %q", s, n, got)
	}
	kept := got
	if i := strings.LastIndex(got, markPrefix); i >= 0 {
		kept = got[:i]
	}
	require.True(t, strings.HasPrefix(s, kept), "%q is not a prefix of %q", kept, s)
}

func FuzzTruncate(f *testing.F) {
	for _, seed := range []struct {
		s string
		n int
	}{{"abcdef", 2}, {"abcdef", 0}, {"abc", 5}, {"éééé", 3}, {"日本語テキスト", 7}, {"\xff\xfe", 1}, {"a\x80\x80\x80\x80b", 3}} {
		f.Add(seed.s, seed.n)
	}
	f.Fuzz(func(t *testing.T, s string, n int) {
		n %= len(s) + 8
		got := Truncate(s, n)
		checkTruncated(t, s, n, got, "…")
		counted := TruncateCounted(s, n)
		checkTruncated(t, s, n, counted, "…")
		if len(s) > n && strings.Contains(counted, "[truncated ") {
			i := strings.LastIndex(counted, "… [truncated ")
			require.Equal(t, fmt.Sprintf("… [truncated %d bytes]", len(s)-i), counted[i:], "the count is exact")
		}
	})
}

func FuzzRedact(f *testing.F) {
	f.Add("token ghs_16C7e42F292c6912E7710c838347Ae178B4a ok", "s3cr3tvalue", "xyzw")
	f.Add("https://u:p@h/x \x1b[31mred", "abcdefgh", "ghp_")
	f.Add("-----BEGIN RSA PRIVATE KEY-----\nabc", "REDACTEDx", "é")
	r, err := New(nil)
	require.NoError(f, err)
	f.Fuzz(func(t *testing.T, text, secret, body string) {
		// A literal secret of token characters is gone from the output wherever it was put,
		// unless it is part of the mask itself.
		secret = strings.Map(func(r rune) rune {
			if r < 128 && (unicode.IsLetter(r) || unicode.IsDigit(r)) {
				return r
			}
			return -1
		}, secret)
		rr, err := New(nil)
		require.NoError(t, err)
		rr.AddLiteral(secret)
		in := text + secret + text
		out := rr.Line(in)
		if len(secret) >= 6 && !strings.Contains(Mask, secret) {
			require.NotContains(t, out, secret)
		}
		// A GitHub token shape is gone whatever surrounds it.
		tok := "ghs_" + strings.Repeat("A", 16) + strings.Map(func(r rune) rune {
			if r < 128 && (unicode.IsLetter(r) || unicode.IsDigit(r)) {
				return r
			}
			return -1
		}, body)
		out = r.Line(text + " " + tok + " " + text)
		require.NotContains(t, out, tok)
		// Line leaves no control characters but tab, and keeps valid UTF-8 valid.
		for _, c := range out {
			require.True(t, c == '\t' || c >= 0x20 && c != 0x7f, "control character %U in %q", c, out)
		}
		if utf8.ValidString(text) && utf8.ValidString(body) {
			require.True(t, utf8.ValidString(out))
		}
	})
}
