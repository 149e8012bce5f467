package config

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func base(t *testing.T) map[string]string {
	dir := t.TempDir()
	for _, f := range []string{"cert.pem", "key.pem", "ca.pem"} {
		require.NoError(t, os.WriteFile(filepath.Join(dir, f), []byte("x"), 0o600))
	}
	return map[string]string{
		"TASKRUNNER_TASK_ID": "0b7c", "TASKRUNNER_REPO": "acme/greet", "TASKRUNNER_PROMPT": "do it",
		"TASKRUNNER_EVENTS_ADDR":   "events.internal:7070",
		"TASKRUNNER_TLS_CERT_FILE": filepath.Join(dir, "cert.pem"), "TASKRUNNER_TLS_KEY_FILE": filepath.Join(dir, "key.pem"),
		"TASKRUNNER_TLS_CA_FILE": filepath.Join(dir, "ca.pem"),
	}
}

func environ(m map[string]string) []string {
	var out []string
	for k, v := range m {
		out = append(out, k+"="+v)
	}
	return out
}

func TestLoadDefaults(t *testing.T) {
	c, err := Load(environ(base(t)))
	require.NoError(t, err)
	require.Equal(t, "main", c.BaseBranch)
	require.Equal(t, "claude", c.Agent)
	require.Equal(t, "events.internal:7070", c.TokenAddr, "the token service defaults to the events address")
	require.Equal(t, 50, c.MaxTurns)
	require.Equal(t, "65534", c.AgentUser)
	require.Equal(t, "claude", c.ClaudeBin)
	require.Equal(t, "openspec", c.OpenSpecBin)
	require.True(t, c.DeadlineTime().IsZero())
	require.Equal(t, 1, c.Run, "a runner without TASKRUNNER_RUN works on the first run")
}

func TestLoadFollowup(t *testing.T) {
	m := base(t)
	m["TASKRUNNER_RUN"] = "3"
	m["TASKRUNNER_FOLLOWUP_PROMPT"] = "greet:12: also accept -f"
	m["TASKRUNNER_PR_NUMBER"] = "7"
	m["TASKRUNNER_PR_URL"] = "https://github.com/acme/greet/pull/7"
	m["TASKRUNNER_CONSOLE_URL"] = "https://console.example"
	m["TASKRUNNER_TRACE_URL_TEMPLATE"] = "https://jaeger.example/trace/{trace_id}"
	c, err := Load(environ(m))
	require.NoError(t, err)
	require.Equal(t, 3, c.Run)
	require.Equal(t, "greet:12: also accept -f", c.FollowupPrompt)
	require.EqualValues(t, 7, c.PRNumber)
	require.Equal(t, "https://github.com/acme/greet/pull/7", c.PRURL)
	require.Equal(t, "https://console.example", c.ConsoleURL)
	require.Equal(t, "https://jaeger.example/trace/{trace_id}", c.TraceURLTemplate)
}

func TestLoadCodex(t *testing.T) {
	cases := []struct {
		name string
		set  map[string]string
		url  string
	}{
		{name: "defaults", set: map[string]string{}, url: "https://api.openai.com/v1"},
		{name: "from OPENAI_BASE_URL", set: map[string]string{"OPENAI_BASE_URL": "http://127.0.0.1:8089/v1"}, url: "http://127.0.0.1:8089/v1"},
		{name: "explicit wins", set: map[string]string{"OPENAI_BASE_URL": "http://a/v1", "TASKRUNNER_CODEX_BASE_URL": "http://b/v1"}, url: "http://b/v1"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := base(t)
			m["TASKRUNNER_AGENT"] = "codex"
			for k, v := range tc.set {
				m[k] = v
			}
			c, err := Load(environ(m))
			require.NoError(t, err)
			require.Equal(t, AgentCodex, c.Agent)
			require.Equal(t, tc.url, c.CodexBaseURL)
			require.Equal(t, "gpt-5.5", c.CodexModel)
			require.Equal(t, "codex", c.CodexBin)
			require.InDelta(t, 1.25, c.CodexPriceInputPerMTok, 1e-12)
			require.InDelta(t, 0.125, c.CodexPriceCachedInputPerMTok, 1e-12)
			require.InDelta(t, 10.0, c.CodexPriceOutputPerMTok, 1e-12)
		})
	}
}

func TestLoadNamesTheBadVariable(t *testing.T) {
	cases := []struct {
		name string
		set  map[string]string
		drop string
		want string
	}{
		{name: "missing task id", drop: "TASKRUNNER_TASK_ID", want: "TASKRUNNER_TASK_ID"},
		{name: "empty prompt", set: map[string]string{"TASKRUNNER_PROMPT": ""}, want: "TASKRUNNER_PROMPT"},
		{name: "bad repo", set: map[string]string{"TASKRUNNER_REPO": "greet"}, want: "TASKRUNNER_REPO: want owner/name"},
		{name: "bad branch", set: map[string]string{"TASKRUNNER_BASE_BRANCH": "-x"}, want: "TASKRUNNER_BASE_BRANCH"},
		{name: "unknown agent", set: map[string]string{"TASKRUNNER_AGENT": "gemini"}, want: `TASKRUNNER_AGENT: want "claude" or "codex", got "gemini"`},
		{name: "codex base URL", set: map[string]string{"TASKRUNNER_AGENT": "codex", "TASKRUNNER_CODEX_BASE_URL": "localhost:8080"}, want: "TASKRUNNER_CODEX_BASE_URL"},
		{name: "codex empty model", set: map[string]string{"TASKRUNNER_AGENT": "codex", "TASKRUNNER_CODEX_MODEL": " "}, want: "TASKRUNNER_CODEX_MODEL"},
		{name: "negative price", set: map[string]string{"TASKRUNNER_CODEX_PRICE_OUTPUT_PER_MTOK": "-2"}, want: "TASKRUNNER_CODEX_PRICE_OUTPUT_PER_MTOK: must not be negative"},
		{name: "price not a number", set: map[string]string{"TASKRUNNER_CODEX_PRICE_INPUT_PER_MTOK": "cheap"}, want: "TASKRUNNER_CODEX_PRICE_INPUT_PER_MTOK"},
		{name: "bad address", set: map[string]string{"TASKRUNNER_TOKEN_ADDR": "nohost"}, want: "TASKRUNNER_TOKEN_ADDR"},
		{name: "turns not a number", set: map[string]string{"TASKRUNNER_MAX_TURNS": "many"}, want: "TASKRUNNER_MAX_TURNS"},
		{name: "turns zero", set: map[string]string{"TASKRUNNER_MAX_TURNS": "0"}, want: "TASKRUNNER_MAX_TURNS: must be positive"},
		{name: "negative budget", set: map[string]string{"TASKRUNNER_MAX_BUDGET_USD": "-1"}, want: "TASKRUNNER_MAX_BUDGET_USD"},
		{name: "bad deadline", set: map[string]string{"TASKRUNNER_DEADLINE": "tomorrow"}, want: "TASKRUNNER_DEADLINE"},
		{name: "bad traceparent", set: map[string]string{"TRACEPARENT": "abc"}, want: "TRACEPARENT"},
		{name: "bad pattern", set: map[string]string{"TASKRUNNER_REDACT_PATTERNS": "ok\n("}, want: "TASKRUNNER_REDACT_PATTERNS"},
		{name: "missing key", drop: "TASKRUNNER_TLS_KEY_FILE", want: "TASKRUNNER_TLS_KEY_FILE: required (or TASKRUNNER_TLS_KEY_PEM)"},
		{name: "both cert forms", set: map[string]string{"TASKRUNNER_TLS_CERT_PEM": "x"}, want: "TASKRUNNER_TLS_CERT_FILE: set either"},
		{name: "run zero", set: map[string]string{"TASKRUNNER_RUN": "0"}, want: "TASKRUNNER_RUN: must be 1 or more"},
		{name: "follow-up without prompt", set: map[string]string{"TASKRUNNER_RUN": "2", "TASKRUNNER_PR_NUMBER": "4"}, want: "TASKRUNNER_FOLLOWUP_PROMPT: required for a follow-up run"},
		{name: "follow-up without PR", set: map[string]string{"TASKRUNNER_RUN": "2", "TASKRUNNER_FOLLOWUP_PROMPT": "fix it"}, want: "TASKRUNNER_PR_NUMBER: required for a follow-up run"},
		{name: "bad console URL", set: map[string]string{"TASKRUNNER_CONSOLE_URL": "console.local"}, want: "TASKRUNNER_CONSOLE_URL: want an http(s) URL"},
		{name: "unreadable ca", set: map[string]string{"TASKRUNNER_TLS_CA_FILE": "/nonexistent/ca.pem"}, want: "TASKRUNNER_TLS_CA_FILE: cannot read"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := base(t)
			delete(m, tc.drop)
			for k, v := range tc.set {
				m[k] = v
			}
			_, err := Load(environ(m))
			require.ErrorContains(t, err, tc.want)
		})
	}
}

func TestValuesAndHelpers(t *testing.T) {
	m := base(t)
	m["TRACEPARENT"] = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	m["TASKRUNNER_DEADLINE"] = "2026-11-29T15:04:05Z"
	m["TASKRUNNER_REDACT_PATTERNS"] = "A+\n\nB+\n"
	m["TASKRUNNER_AGENT_USER"] = "4242"
	c, err := Load(environ(m))
	require.NoError(t, err)
	require.Equal(t, "4bf92f3577b34da6a3ce929d0e0e4736", c.TraceID())
	require.Equal(t, 2026, c.DeadlineTime().Year())
	p, err := c.RedactRegexps()
	require.NoError(t, err)
	require.Equal(t, []string{"A+", "B+"}, p)
	uid, gid, err := c.AgentCredential()
	require.NoError(t, err)
	require.EqualValues(t, 4242, uid)
	require.EqualValues(t, 4242, gid)
}
