package browsertest_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/taskrunner/taskrunner/tools/browsertest"
)

func TestRunNeedsOptions(t *testing.T) {
	err := browsertest.Run(context.Background(), browsertest.Options{BaseURL: "http://127.0.0.1:1"})
	require.ErrorContains(t, err, "BaseURL, Token and OutDir are required")
}

// TestScriptUsage checks that the script explains a bad invocation and
// exits 2 (it loads playwright-core first, so this also proves it is
// installed and importable).
func TestScriptUsage(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node is not installed")
	}
	if _, err := os.Stat("../../node_modules/playwright-core"); err != nil {
		if os.Getenv("TASKRUNNER_REQUIRE_AGENTS") != "" {
			t.Fatalf("playwright-core is not installed (run npm ci at the repository root): %v", err)
		}
		t.Skip("playwright-core is not installed; run npm ci at the repository root")
	}
	for _, tc := range []struct {
		env  []string
		want string
	}{
		{nil, "BASE_URL is required"},
		{[]string{"BASE_URL=http://127.0.0.1:1"}, "TOKEN (or TOKEN_FILE) is required"},
		{[]string{"BASE_URL=http://127.0.0.1:1", "TOKEN=x", "SCENARIOS=nope"}, `unknown scenario "nope"`},
		{[]string{"BASE_URL=http://127.0.0.1:1", "TOKEN=x", "SCENARIOS=trace,bogus"}, `unknown scenario "bogus" (have create-task, validation, daily-work, queue, trace, cors, cancel-review)`},
		{[]string{"BASE_URL=http://127.0.0.1:1", "TOKEN=x", "SCENARIOS=cors"}, "the cors scenario needs CORS_PAGE and CORS_DENIED_PAGE"},
	} {
		cmd := exec.Command(node, "console.mjs")
		cmd.Env = append(cleanEnv(), tc.env...)
		out, err := cmd.CombinedOutput()
		var exit *exec.ExitError
		require.True(t, errors.As(err, &exit), "%v: %s", err, out)
		require.Equal(t, 2, exit.ExitCode(), string(out))
		require.Contains(t, string(out), tc.want)
	}
}

func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		switch strings.SplitN(kv, "=", 2)[0] {
		case "BASE_URL", "TOKEN", "TOKEN_FILE", "SCENARIOS", "OUT_DIR", "DEMO_TASK_ID", "CORS_PAGE", "CORS_DENIED_PAGE":
			continue
		}
		env = append(env, kv)
	}
	return env
}

// TestConsole runs the browser scenarios against a running stack, e.g.
//
//	make run &   # then:
//	BROWSERTEST_BASE_URL=http://127.0.0.1:8080 BROWSERTEST_TOKEN=$(cat .dev/token) go test ./tools/browsertest -run TestConsole -v
//
// Artifacts go to BROWSERTEST_OUT_DIR (default: a temporary directory,
// logged). The end-to-end test calls browsertest.Run against its own stack.
func TestConsole(t *testing.T) {
	base := os.Getenv("BROWSERTEST_BASE_URL")
	if base == "" {
		t.Skip("BROWSERTEST_BASE_URL is not set (a gateway serving the console, e.g. from make run)")
	}
	token := os.Getenv("BROWSERTEST_TOKEN")
	if token == "" {
		b, err := os.ReadFile("../../.dev/token")
		require.NoError(t, err, "set BROWSERTEST_TOKEN or run make run (it writes .dev/token)")
		token = strings.TrimSpace(string(b))
	}
	out := os.Getenv("BROWSERTEST_OUT_DIR")
	if out == "" {
		out = t.TempDir()
	}
	out, err := filepath.Abs(out)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	err = browsertest.Run(ctx, browsertest.Options{BaseURL: base, Token: token, OutDir: out, Output: testWriter{t}})
	t.Logf("artifacts in %s", out)
	require.NoError(t, err)
	require.FileExists(t, filepath.Join(out, "console-task.png"))
	require.FileExists(t, filepath.Join(out, "console-validation.png"))
	for _, f := range []string{"console-list.png", "console-queue.png", "console-trace.png"} {
		require.FileExists(t, filepath.Join(out, f))
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// TestCrossOriginServesThePageOnTwoOrigins: the CORS scenario's page comes
// from two distinct origins, neither of them anything else.
func TestCrossOriginServesThePageOnTwoOrigins(t *testing.T) {
	co, err := browsertest.StartCrossOrigin()
	require.NoError(t, err)
	defer co.Close()
	require.NotEqual(t, co.Allowed, co.Denied)
	for _, origin := range []string{co.Allowed, co.Denied} {
		require.Regexp(t, `^http://127\.0\.0\.1:\d+$`, origin)
		resp, err := http.Get(origin + "/")
		require.NoError(t, err)
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		require.Contains(t, string(body), `data-testid="cors-result"`)
		require.Contains(t, string(body), "new EventSource(")
		resp, err = http.Get(origin + "/other")
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusNotFound, resp.StatusCode)
	}
}
