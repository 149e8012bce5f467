package e2e

import (
	"context"
	"fmt"
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
// queued task's position, the demo task's trace waterfall, and CORS: a
// page of a second origin (crossOrigin, listed in TASKRUNNER_CORS_ORIGINS)
// calls the API and opens the demo task's event stream, and the same page
// from an origin that is not listed can do neither. The cancel-review
// scenario is left out here: it would close the demo task's pull request,
// which this test merges afterwards; runBrowserCancelReview runs it on a
// task of its own.
func runBrowserTests(t *testing.T, s *stack) {
	out := browserArtifacts(t)
	// Screenshots of an earlier run's failures would pass for this run's.
	old, _ := filepath.Glob(filepath.Join(out, "failure-*.png"))
	for _, f := range old {
		require.NoError(t, os.Remove(f))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	require.NotNil(t, crossOrigin, "TestMain starts the second origin")
	err := browsertest.Run(ctx, browsertest.Options{BaseURL: s.api, Token: s.token, OutDir: out, RepoRoot: repoRoot(t), Output: testWriter{t},
		CORSPage: crossOrigin.Allowed + "/", CORSDeniedPage: crossOrigin.Denied + "/"})
	require.NoError(t, err)
	require.FileExists(t, filepath.Join(out, "console-cors.png"))
	require.FileExists(t, filepath.Join(out, "console-task.png"))
	require.FileExists(t, filepath.Join(out, "console-validation.png"))
	for _, f := range []string{"console-list.png", "console-queue.png", "console-trace.png"} {
		require.FileExists(t, filepath.Join(out, f))
	}
	t.Logf("browser screenshots in %s", out)
}

// runBrowserCancelReview cancels the awaiting-review task id from its page
// in the console (the cancel-review scenario): the warning that Cancel
// closes pull request #N is checked on screen before the click, and
// console-cancel-review.png shows it. Its result goes to
// result-cancel-review.json, next to the first run's result.json.
func runBrowserCancelReview(t *testing.T, s *stack, id string) {
	out := browserArtifacts(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	err := browsertest.Run(ctx, browsertest.Options{BaseURL: s.api, Token: s.token, OutDir: out, RepoRoot: repoRoot(t), Output: testWriter{t},
		Scenarios: []string{browsertest.ScenarioCancelReview}, DemoTaskID: id, ResultFile: "result-cancel-review.json"})
	require.NoError(t, err)
	require.FileExists(t, filepath.Join(out, "console-cancel-review.png"))
}

// browserArtifacts is where the browser tests' screenshots go (made if
// missing); it fails (or skips, unless services are required) without
// Chromium.
func browserArtifacts(t *testing.T) string {
	if _, err := os.Stat(browsertest.DefaultChromium); err != nil {
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
	return out
}

// crossOrigin serves the CORS scenario's page from two origins other than
// the gateway's. It starts before any stack, because the gateway reads
// TASKRUNNER_CORS_ORIGINS when it starts: every stack of this package
// inherits it (devstack passes its environment on), so each gateway allows
// exactly crossOrigin.Allowed.
var crossOrigin *browsertest.CrossOrigin

func TestMain(m *testing.M) {
	co, err := browsertest.StartCrossOrigin()
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e: cannot start the second origin of the CORS test:", err)
		os.Exit(1)
	}
	crossOrigin = co
	if err := os.Setenv("TASKRUNNER_CORS_ORIGINS", co.Allowed); err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		os.Exit(1)
	}
	code := m.Run()
	co.Close()
	os.Exit(code)
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) { w.t.Log(string(p)); return len(p), nil }
