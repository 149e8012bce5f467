package e2e

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/taskrunner/taskrunner/tools/browsertest"
)

// runBrowserTests drives the web console in headless Chromium: sign in,
// create a task and watch its four stages complete live up to the PR link
// (screenshot kept as an artifact), the empty-prompt validation error, the
// list's columns and filters with Dispatch and Cancel from a task's page, a
// queued task's position, and the demo task's trace waterfall. The
// cancel-review scenario is left out here: it would close the demo task's
// pull request, which this test merges afterwards.
func runBrowserTests(t *testing.T, s *stack) {
	if _, err := os.Stat("/usr/bin/chromium"); err != nil {
		if os.Getenv("TASKRUNNER_REQUIRE_SERVICES") != "" {
			t.Fatalf("Chromium is required for the browser tests (apt-get install chromium): %v", err)
		}
		t.Skip("Chromium not installed")
	}
	out := os.Getenv("TASKRUNNER_ARTIFACTS_DIR")
	if out == "" {
		out = filepath.Join(repoRoot(t), ".dev", "artifacts", "browsertest")
	}
	require.NoError(t, os.MkdirAll(out, 0o755))
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	err := browsertest.Run(ctx, browsertest.Options{BaseURL: s.api, Token: s.token, OutDir: out, RepoRoot: repoRoot(t), Output: testWriter{t}})
	require.NoError(t, err)
	require.FileExists(t, filepath.Join(out, "console-task.png"))
	require.FileExists(t, filepath.Join(out, "console-validation.png"))
	for _, f := range []string{"console-list.png", "console-queue.png", "console-trace.png"} {
		require.FileExists(t, filepath.Join(out, f))
	}
	t.Logf("browser screenshots in %s", out)
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) { w.t.Log(string(p)); return len(p), nil }
