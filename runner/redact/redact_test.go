package redact

import (
	"strings"
	"testing"

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
