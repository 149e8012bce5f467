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
// which this test merges afterwards.
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
