package main

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/taskrunner/taskrunner/runner/agent/claude"
	"github.com/taskrunner/taskrunner/runner/agent/codex"
	"github.com/taskrunner/taskrunner/runner/config"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestBadEnvironment builds the real binary and starts it with a bad variable: it must exit
// with status 2 and name the variable.
func TestBadEnvironment(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "runner")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, "go build: %s", out)

	dir := t.TempDir()
	for _, f := range []string{"cert.pem", "key.pem", "ca.pem"} {
		require.NoError(t, os.WriteFile(filepath.Join(dir, f), []byte("x"), 0o600))
	}
	valid := []string{
		"PATH=" + os.Getenv("PATH"),
		"TASKRUNNER_TASK_ID=t1", "TASKRUNNER_REPO=acme/greet", "TASKRUNNER_PROMPT=p",
		"TASKRUNNER_EVENTS_ADDR=127.0.0.1:1",
		"TASKRUNNER_TLS_CERT_FILE=" + filepath.Join(dir, "cert.pem"),
		"TASKRUNNER_TLS_KEY_FILE=" + filepath.Join(dir, "key.pem"),
		"TASKRUNNER_TLS_CA_FILE=" + filepath.Join(dir, "ca.pem"),
	}
	cases := []struct {
		name string
		env  []string
		want []string
	}{
		{name: "nothing set", env: []string{"PATH=" + os.Getenv("PATH")}, want: []string{"TASKRUNNER_TASK_ID", "TASKRUNNER_REPO", "TASKRUNNER_PROMPT", "TASKRUNNER_EVENTS_ADDR"}},
		{name: "unknown agent", env: append(append([]string(nil), valid...), "TASKRUNNER_AGENT=gemini"), want: []string{"TASKRUNNER_AGENT"}},
		{name: "turns not a number", env: append(append([]string(nil), valid...), "TASKRUNNER_MAX_TURNS=lots"), want: []string{"TASKRUNNER_MAX_TURNS"}},
		{name: "bad deadline", env: append(append([]string(nil), valid...), "TASKRUNNER_DEADLINE=soon"), want: []string{"TASKRUNNER_DEADLINE"}},
		{name: "certificate is not PEM", env: valid, want: []string{"TASKRUNNER_TLS_CERT_"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(bin)
			cmd.Env = tc.env
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			err := cmd.Run()
			var exitErr *exec.ExitError
			require.True(t, errors.As(err, &exitErr), "want a non-zero exit, got %v", err)
			require.Equal(t, exitConfig, exitErr.ExitCode())
			for _, w := range tc.want {
				require.Contains(t, stderr.String(), w)
			}
		})
	}
}

func TestNewAgentFollowsTASKRUNNER_AGENT(t *testing.T) {
	require.IsType(t, &claude.Adapter{}, newAgent(config.Config{Agent: config.AgentClaude}, "claude", "/w/repo", "/w/home", nil, nil, ""))
	a := newAgent(config.Config{Agent: config.AgentCodex, CodexModel: "m", CodexBaseURL: "http://x/v1"}, "codex", "/w/repo", "/w/home", nil, nil, "k")
	require.IsType(t, &codex.Adapter{}, a)
}
