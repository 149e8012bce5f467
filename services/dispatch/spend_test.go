package dispatch

import (
	"bytes"
	"context"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
	"github.com/taskrunner/taskrunner/services/auth"
	"github.com/taskrunner/taskrunner/services/errs"
	"github.com/taskrunner/taskrunner/services/sandbox"
	"github.com/taskrunner/taskrunner/services/task"
)

// spend records usage on a running task as the model proxy does.
func (h *harness) spend(t *testing.T, id string, usd float64) {
	t.Helper()
	_, _, err := h.tasks.Advance(context.Background(), id, "", task.Advance{Usage: &task.Usage{CostUSD: usd, TokensIn: 1, TokensOut: 1}})
	require.NoError(t, err)
}

// TestOwnerDailyUSDQuotaAtTheLimit: once an owner's tasks of the day have spent the daily
// quota, the next dispatch is refused with ResourceExhausted (HTTP 429) and a Retry-After
// until 00:00 UTC, and a create with dispatch stores nothing; just under the quota, and for
// another owner, dispatch goes on.
func TestOwnerDailyUSDQuotaAtTheLimit(t *testing.T) {
	h := newHarness(t)
	cfg := testConfig()
	cfg.OwnerDailyUSD = 2
	s := h.server(t, cfg, "sb")
	ctx := context.Background()

	first := h.create(t, "alice", "acme/a")
	_, err := s.DispatchTask(ctx, first)
	require.NoError(t, err)
	h.spend(t, first, 1.99)
	under := h.create(t, "alice", "acme/b")
	tk, err := s.DispatchTask(ctx, under)
	require.NoError(t, err, "1.99 of 2 USD spent: still admitted")
	require.Equal(t, task.StatusRunning, tk.Status)
	h.spend(t, under, 0.01) // exactly at the limit now

	refused := h.create(t, "alice", "acme/c")
	_, err = s.DispatchTask(ctx, refused)
	require.ErrorIs(t, err, errs.ErrQuotaExceeded)
	var de *errs.Error
	require.ErrorAs(t, err, &de)
	now := time.Now().UTC()
	untilMidnight := time.Until(time.Date(now.Year(), now.Month(), now.Day()+1, 0, 0, 0, 0, time.UTC)).Seconds()
	require.InDelta(t, untilMidnight, float64(de.RetryAfterSeconds), 5, "Retry-After is the time until 00:00 UTC")
	require.Contains(t, de.Message, "daily 2.00 USD")
	st, ok := errs.ToStatus(err)
	require.True(t, ok)
	require.Equal(t, "ResourceExhausted", st.Code().String())
	require.Equal(t, task.StatusProposing, h.status(t, refused), "the refused task is unchanged")
	var n int
	require.NoError(t, h.db.Pool.QueryRow(ctx, `SELECT count(*) FROM sandboxes WHERE task_id = $1`, refused).Scan(&n))
	require.Zero(t, n, "no sandbox recorded")
	require.NoError(t, h.db.Pool.QueryRow(ctx, `SELECT count(*) FROM task_events WHERE task_id = $1 AND type = 'status_change' AND payload::text LIKE '%RUNNING%'`, refused).Scan(&n))
	require.Zero(t, n, "nothing on the refused task's timeline")

	// Another owner is not affected.
	_, err = s.DispatchTask(ctx, h.create(t, "bob", "acme/d"))
	require.NoError(t, err)

	// Create with dispatch over the quota: 429 and nothing stored.
	tasks := task.New(h.tasks, s, slog.New(slog.DiscardHandler))
	actx := auth.WithPrincipal(ctx, auth.Principal{Owner: "alice", Scopes: []string{auth.ScopeTasks}})
	before, _, err := h.tasks.List(ctx, "alice", task.Filter{}, 100, "")
	require.NoError(t, err)
	_, err = tasks.CreateTask(actx, &taskrunnerv1.CreateTaskRequest{Repo: "acme/e", Prompt: "p", Dispatch: true, RequestId: "over"})
	require.ErrorIs(t, err, errs.ErrQuotaExceeded)
	after, _, err := h.tasks.List(ctx, "alice", task.Filter{}, 100, "")
	require.NoError(t, err)
	require.Len(t, after, len(before), "a refused create stores nothing")
}

// TestNoModelKeyInTheSandbox dispatches a task through the process provider with the model
// keys in the control plane's environment (and listed in PassEnv by mistake), then scans the
// environment of every process of the sandbox (/proc/<pid>/environ) and every file of its
// tree for the keys' values.
func TestNoModelKeyInTheSandbox(t *testing.T) {
	h := newHarness(t)
	cfg := testConfig()
	cfg.ModelProxyAddr = "127.0.0.1:7444"
	cfg.PassEnv = []string{"ANTHROPIC_API_KEY", "OPENAI_API_KEY", "ANTHROPIC_AUTH_TOKEN", "CLAUDE_CODE_OAUTH_TOKEN", "OTEL_EXPORTER_OTLP_ENDPOINT"}
	s := h.server(t, cfg, "sb")
	secrets := map[string]string{"ANTHROPIC_API_KEY": "sk-ant-api03-secret-value-for-the-scan", "OPENAI_API_KEY": "sk-proj-secret-value-for-the-scan",
		"ANTHROPIC_AUTH_TOKEN": "auth-token-secret-value-for-the-scan", "CLAUDE_CODE_OAUTH_TOKEN": "oauth-secret-value-for-the-scan",
		"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}
	s.d.Getenv = func(k string) string { return secrets[k] }
	id := h.create(t, "alice", "acme/widgets")
	_, err := s.DispatchTask(context.Background(), id)
	require.NoError(t, err)
	root := filepath.Join(h.dir, "sb", sandbox.Name(id))
	require.Eventually(t, func() bool { _, err := os.Stat(filepath.Join(root, "env.txt")); return err == nil }, 10*time.Second, 20*time.Millisecond)

	var environs [][]byte
	procs, err := filepath.Glob("/proc/[0-9]*/environ")
	require.NoError(t, err)
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err == nil && bytes.Contains(b, []byte("TASKRUNNER_TASK_ID="+id+"\x00")) {
			environs = append(environs, b)
		}
	}
	require.NotEmpty(t, environs, "the sandbox's processes were found")
	for _, env := range environs {
		require.Contains(t, string(env), "TASKRUNNER_MODEL_PROXY_ADDR=127.0.0.1:7444")
		require.Contains(t, string(env), "OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318", "non-secret variables still pass")
	}
	var files []string
	require.NoError(t, filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		files = append(files, p)
		environs = append(environs, b)
		return nil
	}))
	require.NotEmpty(t, files)
	for k, v := range secrets {
		if strings.HasPrefix(k, "OTEL_") {
			continue
		}
		for _, b := range environs {
			require.NotContains(t, string(b), v, "%s's value is in the sandbox", k)
		}
	}
}
