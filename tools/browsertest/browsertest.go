package browsertest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// Scenario names understood by console.mjs.
const (
	ScenarioCreateTask = "create-task"
	ScenarioValidation = "validation"
	ScenarioDailyWork  = "daily-work"
	ScenarioQueue      = "queue"
	ScenarioTrace      = "trace"
	// ScenarioCancelReview cancels the demo task (closing its pull request),
	// so it is not in the default set.
	ScenarioCancelReview = "cancel-review"
	// ScenarioCORS loads a page of another origin (CrossOrigin) that calls
	// the API and opens an event stream; in the default set when
	// Options.CORSPage is set.
	ScenarioCORS = "cors"
)

// DefaultChromium is Debian's chromium package.
const DefaultChromium = "/usr/bin/chromium"

// Options configure Run. BaseURL, Token and OutDir are required.
type Options struct {
	// BaseURL is the gateway serving the console and the API.
	BaseURL string
	// Token is an API token of the user the browser signs in as.
	Token string
	// OutDir receives the screenshots and result.json.
	OutDir string
	// ResultFile names the result file in OutDir; empty: result.json. A
	// second run into the same OutDir names another to keep the first's.
	ResultFile string
	// Scenarios to run; empty runs the default set (every one but
	// ScenarioCancelReview).
	Scenarios []string
	// DemoTaskID is the awaiting-review task of the trace and cancel-review
	// scenarios; empty: the task create-task creates in the same run.
	DemoTaskID string
	// CORSPage and CORSDeniedPage are cors.html at an origin the gateway
	// allows (TASKRUNNER_CORS_ORIGINS) and at one it does not (CrossOrigin's
	// Allowed and Denied); the cors scenario needs both.
	CORSPage, CORSDeniedPage string
	// TaskTimeout bounds how long the created task may take to open its PR.
	// Zero means the script's default (4 minutes).
	TaskTimeout time.Duration
	// Chromium is the browser binary. Default DefaultChromium.
	Chromium string
	// Node is the Node.js binary. Default "node" from PATH.
	Node string
	// RepoRoot is the repository root, whose node_modules holds
	// playwright-core. Default: found from this source file.
	RepoRoot string
	// Output, when set, receives the script's stdout and stderr as they
	// are written (e.g. a testing.T writer).
	Output io.Writer
}

// Script is console.mjs's path inside the repository.
const Script = "tools/browsertest/console.mjs"

// Run runs console.mjs and waits for it. A failing scenario is an error
// holding the script's last lines of output.
func Run(ctx context.Context, o Options) error {
	if o.BaseURL == "" || o.Token == "" || o.OutDir == "" {
		return errors.New("browsertest: BaseURL, Token and OutDir are required")
	}
	root := o.RepoRoot
	if root == "" {
		_, file, _, ok := runtime.Caller(0)
		if !ok {
			return errors.New("browsertest: cannot locate the repository; set RepoRoot")
		}
		root = filepath.Join(filepath.Dir(file), "..", "..")
	}
	if _, err := os.Stat(filepath.Join(root, "node_modules", "playwright-core")); err != nil {
		return fmt.Errorf("browsertest: playwright-core is not installed in %s (run npm ci there): %w", root, err)
	}
	chromium := o.Chromium
	if chromium == "" {
		chromium = DefaultChromium
	}
	if _, err := os.Stat(chromium); err != nil {
		return fmt.Errorf("browsertest: no browser at %s (apt-get install chromium): %w", chromium, err)
	}
	node := o.Node
	if node == "" {
		node = "node"
	}
	cmd := exec.CommandContext(ctx, node, filepath.Join(root, Script))
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "BASE_URL="+o.BaseURL, "TOKEN="+o.Token, "OUT_DIR="+o.OutDir, "CHROMIUM="+chromium,
		"SCENARIOS="+strings.Join(o.Scenarios, ","), "DEMO_TASK_ID="+o.DemoTaskID,
		"CORS_PAGE="+o.CORSPage, "CORS_DENIED_PAGE="+o.CORSDeniedPage)
	if o.ResultFile != "" {
		cmd.Env = append(cmd.Env, "RESULT_FILE="+o.ResultFile)
	}
	if o.TaskTimeout > 0 {
		cmd.Env = append(cmd.Env, "TASK_TIMEOUT_MS="+strconv.FormatInt(o.TaskTimeout.Milliseconds(), 10))
	}
	var out bytes.Buffer
	var w io.Writer = &out
	if o.Output != nil {
		w = io.MultiWriter(&out, o.Output)
	}
	cmd.Stdout, cmd.Stderr = w, w
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("browsertest: %s %s: %w\n%s", node, Script, err, tail(out.String(), 40))
	}
	return nil
}

// tail returns the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
