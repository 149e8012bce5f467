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

// TestBuiltinUnion shows every secret shape the three redactors this package replaced
// covered: runner/redact (the runner's logs and reasons), task.CleanReason (stored failure
// reasons, services/task) and githubtoken's redact (GitHub error messages). Each case names
// the old redactor(s) that masked it; String masks them all, and the secret text is gone.
func TestBuiltinUnion(t *testing.T) {
	cases := []struct{ from, in, secret, want string }{
		// GitHub tokens: runner ≥16 characters, task ≥20, githubtoken ≥8 (and underscores).
		{"runner task githubtoken", "token ghs_16C7e42F292c6912E7710c838347Ae178B4a ok", "ghs_16C7e42F292c6912E7710c838347Ae178B4a", "token [REDACTED] ok"},
		{"githubtoken", "bad ghs_abcd_1234 here", "ghs_abcd_1234", "bad [REDACTED] here"},
		{"githubtoken", "GHP_ABCDEFGH1234 upper case", "GHP_ABCDEFGH1234", "[REDACTED] upper case"},
		{"runner task githubtoken", "gho_abcdefghijklmnopqrstu ghu_abcdefghijklmnopqrstu ghr_abcdefghijklmnopqrstu", "abcdefghijklmnopqrstu", "[REDACTED] [REDACTED] [REDACTED]"},
		{"runner task githubtoken", "github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz", "github_pat_11ABCDEFG", Mask},
		{"githubtoken", "github_pat_short123", "github_pat_short123", Mask},
		// taskrunner API tokens: runner ≥8, task ≥20.
		{"runner", "Authorization: trt_live_abcdef0123456789", "trt_live_abcdef0123456789", "Authorization: " + Mask},
		{"task", "token=trt_abcdefghijklmnopqrstuvwxyz", "trt_abcdefghijklmnopqrstuvwxyz", "token=" + Mask},
		// Model API keys.
		{"runner task", "ANTHROPIC_API_KEY=sk-ant-api03-abcdefghijklmnop-qrstuv", "sk-ant-api03", "ANTHROPIC_API_KEY=" + Mask},
		{"runner task", "sk-proj-abcdefghijklmnop1234", "sk-proj-abcdefghijklmnop1234", Mask},
		// Authorization values: runner bearer/basic ≥16, task bearer ≥12, githubtoken any
		// bearer value and "token <≥20>".
		{"runner task githubtoken", "Authorization: Bearer abcdefghijklmnop1234", "abcdefghijklmnop1234", "Authorization: Bearer " + Mask},
		{"task githubtoken", "bearer abcdefghijkl", "abcdefghijkl", "bearer " + Mask},
		{"githubtoken", "Bearer short", "short", "Bearer " + Mask},
		{"runner", "Authorization: Basic eC1hY2Nlc3MtdG9rZW46Z2hzX3h4eHh4", "eC1hY2Nlc3MtdG9rZW46Z2hzX3h4eHh4", "Authorization: Basic " + Mask},
		{"githubtoken", "Authorization: token 0123456789abcdefghijklmnop", "0123456789abcdefghijklmnop", "Authorization: token " + Mask},
		// git's token user: task and githubtoken; URL credentials: runner.
		{"task githubtoken", "x-access-token:s3cr3tvalue", "s3cr3tvalue", "x-access-token:" + Mask},
		{"runner task", "push https://x-access-token:hunter2hunter2@github.com/o/r.git", "hunter2hunter2", "push https://x-access-token:" + Mask + "@github.com/o/r.git"},
		{"runner", "https://user:pa55word@example.com/x", "pa55word", "https://user:" + Mask + "@example.com/x"},
		// JWTs: githubtoken.
		{"githubtoken", "assertion eyJhbGciOiJSUzI1NiJ9.eyJpc3MiOiIxIn0.c2ln rejected", "eyJhbGciOiJSUzI1NiJ9", "assertion " + Mask + " rejected"},
		// PEM private keys: runner and task; cut before END: runner.
		{"runner task", "key:\n-----BEGIN EC PRIVATE KEY-----\nMHcC\n-----END EC PRIVATE KEY-----\nafter", "MHcC", "key:\n" + Mask + "\nafter"},
		{"runner", "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNz", "b3BlbnNz", Mask},
	}
	for _, tc := range cases {
		t.Run(tc.from+"/"+tc.in, func(t *testing.T) {
			got := String(tc.in)
			require.Equal(t, tc.want, got)
			require.NotContains(t, got, tc.secret)
			require.Equal(t, got, String(got), "masking twice changes nothing")
		})
	}
	// What none of them masked stays: task ids, ordinary words around the shapes.
	for _, keep := range []string{
		"task-0123456789abcdef0123 failed", "the token was refreshed; basic auth is off", "ghs_ alone", "sk-short",
		"timeout", "runner_lost",
	} {
		require.Equal(t, keep, String(keep))
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
	f.Add("token ghs_16C7e42F292c6912E7710c838347Ae178B4a ok", "s3cr3tvalue", "xyzw", uint8(0))
	f.Add("https://u:p@h/x \x1b[31mred", "abcdefgh", "ghp_", uint8(1))
	f.Add("-----BEGIN RSA PRIVATE KEY-----\nabc", "REDACTEDx", "é", uint8(2))
	f.Add("Authorization: Bearer x", "abcdefgh", "q", uint8(3))
	f.Add("token ", "", "0123456789", uint8(4))
	r, err := New(nil)
	require.NoError(f, err)
	f.Fuzz(func(t *testing.T, text, secret, body string, kind uint8) {
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
		// Every built-in shape is gone whatever surrounds it, and masking is idempotent.
		alnum := strings.Map(func(r rune) rune {
			if r < 128 && (unicode.IsLetter(r) || unicode.IsDigit(r)) {
				return r
			}
			return -1
		}, body)
		shapes := []string{
			"ghs_" + strings.Repeat("A", 8) + alnum, "github_pat_" + strings.Repeat("B", 8) + alnum,
			"trt_" + strings.Repeat("C", 8) + alnum, "sk-" + strings.Repeat("D", 16) + alnum,
			"eyJ" + alnum + "E.eyJF." + alnum,
		}
		tok := shapes[int(kind)%len(shapes)]
		out = r.Line(text + " " + tok + " " + text)
		require.NotContains(t, out, tok)
		require.Equal(t, out, r.String(out), "masking twice changes nothing")
		// Line leaves no control characters but tab, and keeps valid UTF-8 valid.
		for _, c := range out {
			require.True(t, c == '\t' || c >= 0x20 && c != 0x7f, "control character %U in %q", c, out)
		}
		if utf8.ValidString(text) && utf8.ValidString(body) {
			require.True(t, utf8.ValidString(out))
		}
	})
}

// FuzzClean: a cleaned text (a task's failure reason, a GitHub error message) is at most n
// bytes, valid UTF-8 when it came in valid, keeps no planted credential, and cleaning it again
// changes nothing. It was task.CleanReason's fuzz target.
func FuzzClean(f *testing.F) {
	f.Add("timeout", 1024)
	f.Add("push failed: https://x-access-token:ghs_abcdefghijklmnopqrstuvwxyz0123@github.com/a/b", 60)
	f.Add("Authorization: Bearer abcdefghijklmnopqrstuvwxyz", 20)
	f.Add(strings.Repeat("é", 600)+" ghp_"+strings.Repeat("a", 36), 1024)
	f.Add("-----BEGIN RSA PRIVATE KEY-----\nMIIE\n-----END RSA PRIVATE KEY-----", 1024)
	f.Add("sk-ant-"+strings.Repeat("x", 40), 300)
	f.Fuzz(func(t *testing.T, s string, n int) {
		if n < 0 {
			n = -n
		}
		n %= 2048
		out := Clean(s, n)
		if len(out) > n {
			t.Fatalf("%d bytes, more than %d", len(out), n)
		}
		if utf8.ValidString(s) && !utf8.ValidString(out) {
			t.Fatalf("valid UTF-8 in, invalid out: %q", out)
		}
		if again := Clean(out, n); again != out {
			t.Fatalf("not idempotent: %q then %q", out, again)
		}
		const tok = "ghs_0123456789abcdefghij"
		if planted := Clean(s+" "+tok+" ", n); strings.Contains(planted, tok) {
			t.Fatalf("a credential survived: %q", planted)
		}
	})
}
