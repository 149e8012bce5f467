package task_test

import (
	"context"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/taskrunner/taskrunner/platform/testkit"
	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
	"github.com/taskrunner/taskrunner/services/auth"
	"github.com/taskrunner/taskrunner/services/dispatch"
	"github.com/taskrunner/taskrunner/services/githubtoken"
	"github.com/taskrunner/taskrunner/services/pki"
	"github.com/taskrunner/taskrunner/services/rpcserver"
	"github.com/taskrunner/taskrunner/services/sandbox/process"
	"github.com/taskrunner/taskrunner/services/store/storetest"
	"github.com/taskrunner/taskrunner/services/task"
	"github.com/taskrunner/taskrunner/tools/forge"
)

// accessEnv is TaskService with the real GitHubTokenService (App mode,
// against the local forge as GitHub) as its repository check and the real
// DispatchService (process provider, a runner script that records its
// start) behind it, with a quota of one dispatch per owner and day.
type accessEnv struct {
	*env
	forge  *forge.Forge
	starts string
}

func newAccessEnv(t *testing.T) *accessEnv {
	t.Helper()
	ctx := context.Background()
	lg := slog.New(slog.DiscardHandler)
	db := storetest.NewDB(t)
	rdb := storetest.NewRedis(t)
	dir := t.TempDir()

	keyFile := filepath.Join(dir, "app-key.pem")
	key, _, err := forge.LoadOrCreateAppKey(keyFile)
	require.NoError(t, err)
	fg, err := forge.New(forge.Config{DataDir: filepath.Join(dir, "forge"), AppID: 4242, AppPublicKey: &key.PublicKey, Logger: lg})
	require.NoError(t, err)
	ts := httptest.NewServer(fg.Handler())
	t.Cleanup(func() { ts.Close(); _ = fg.Close() })
	require.NoError(t, fg.CreateRepo("acme", "widgets", map[string]string{"README.md": "# widgets\n"}))

	store := task.NewStore(db.Pool)
	gh, err := githubtoken.New(githubtoken.Config{APIURL: ts.URL + "/", GitURL: ts.URL, TrustDomain: "taskrunner.test",
		AppID: "4242", AppKeyFile: keyFile, CachePrefix: rdb.Prefix + "githubtoken:"}, githubtoken.Deps{Tasks: store, Redis: rdb.Client, Logger: lg})
	require.NoError(t, err)
	t.Cleanup(gh.Close)

	starts := filepath.Join(dir, "starts.txt")
	runner := filepath.Join(dir, "runner")
	require.NoError(t, os.WriteFile(runner, []byte("#!/bin/sh\necho \"$TASKRUNNER_TASK_ID\" >> \""+starts+"\"\nexec sleep 300\n"), 0o755))
	prov, err := process.New(process.Config{RunnerBin: runner, WorkRoot: filepath.Join(dir, "work"), Bwrap: "never", KillGrace: time.Second}, lg)
	require.NoError(t, err)
	ca, err := pki.NewCA("taskrunner.test", time.Hour)
	require.NoError(t, err)
	d, err := dispatch.New(dispatch.Config{PerOwnerPerDay: 1, PerRepoRunning: 3, GlobalRunning: 10, TaskTimeout: time.Hour,
		HeartbeatInterval: time.Minute, ReaperInterval: time.Hour, CancelGrace: time.Second, RunnerImage: "runner:test",
		RunnerEventsAddr: "127.0.0.1:7443", RunnerServerName: "localhost", MaxTurns: 10, MaxBudgetUSD: 1},
		dispatch.Deps{Pool: db.Pool, Provider: prov, CA: ca, Logger: lg, Getenv: func(string) string { return "" }})
	require.NoError(t, err)
	t.Cleanup(func() {
		sbs, _ := prov.List(context.Background(), nil)
		for _, sb := range sbs {
			_ = prov.Destroy(context.Background(), sb.ID)
		}
	})
	t.Cleanup(d.Wait)

	tasks := task.New(store, d, lg)
	tasks.SetRepoChecker(gh)
	tokens := auth.NewStore(db.Pool)
	srv := rpcserver.New(rpcserver.Options{Logger: lg, Auth: tokens})
	taskrunnerv1.RegisterTaskServiceServer(srv, tasks)
	conn := testkit.ServeConn(t, srv)
	e := &env{db: db, client: taskrunnerv1.NewTaskServiceClient(conn), tokens: map[string]string{}}
	tok, _, err := tokens.Create(ctx, "alice", nil, "test")
	require.NoError(t, err)
	e.tokens["alice"] = tok
	return &accessEnv{env: e, forge: fg, starts: starts}
}

// nothingSpent asserts that no task row, run, sandbox or runner start
// exists beyond want tasks (left proposing).
func (a *accessEnv) nothingSpent(t *testing.T, wantTasks int) {
	t.Helper()
	require.Equal(t, wantTasks, a.count(t, "tasks"), "tasks stored")
	var started int
	require.NoError(t, a.db.Pool.QueryRow(context.Background(), "SELECT count(*) FROM task_runs WHERE started_at IS NOT NULL").Scan(&started))
	require.Zero(t, started, "runs started (the owner's quota)")
	require.Zero(t, a.count(t, "sandboxes"), "sandboxes recorded")
	_, err := os.Stat(a.starts)
	require.True(t, os.IsNotExist(err), "a runner was started")
}

func (a *accessEnv) branchReads(path string) int {
	n := 0
	for _, r := range a.forge.Requests() {
		if r.Kind == "api" && r.Method == "GET" && r.Path == path {
			n++
		}
	}
	return n
}

func requireReason(t *testing.T, err error, reason string) {
	t.Helper()
	for _, d := range status.Convert(err).Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			require.Equal(t, reason, info.GetReason())
			return
		}
	}
	require.Failf(t, "no ErrorInfo", "error %v", err)
}

func TestRepoAccessRefusedBeforeSpending(t *testing.T) {
	a := newAccessEnv(t)
	ctx := a.as("alice")

	refusals := []struct {
		name, repo, branch, want, reason string
	}{
		{"App not installed (no such repository)", "nobody/nothing", "main",
			"the GitHub App cannot access nobody/nothing: install it on the repository", task.ReasonRepoInaccessible},
		{"no such base branch", "acme/widgets", "release-9", "acme/widgets has no branch release-9", task.ReasonBranchNotFound},
	}
	for _, tc := range refusals {
		t.Run("create "+tc.name, func(t *testing.T) {
			for _, dispatchNow := range []bool{true, false} {
				_, err := a.client.CreateTask(ctx, &taskrunnerv1.CreateTaskRequest{Repo: tc.repo, BaseBranch: tc.branch, Prompt: "do it",
					Dispatch: dispatchNow, RequestId: "key-" + tc.repo + tc.branch})
				requireCode(t, err, codes.FailedPrecondition, tc.want)
				requireReason(t, err, tc.reason)
				a.nothingSpent(t, 0)
			}
		})
	}

	// A task stored before its branch went away (here: written by the store
	// directly, past the check) is refused at dispatch and stays proposing.
	stale, _, err := task.NewStore(a.db.Pool).Create(context.Background(),
		task.NewTask{Owner: "alice", Repo: "acme/widgets", BaseBranch: "gone", Prompt: "p", Agent: task.AgentClaude}, "")
	require.NoError(t, err)
	_, err = a.client.DispatchTask(ctx, &taskrunnerv1.DispatchTaskRequest{Id: stale.ID})
	requireCode(t, err, codes.FailedPrecondition, "acme/widgets has no branch gone")
	a.nothingSpent(t, 1)
	got, err := a.client.GetTask(ctx, &taskrunnerv1.GetTaskRequest{Id: stale.ID})
	require.NoError(t, err)
	require.Equal(t, taskrunnerv1.TaskStatus_TASK_STATUS_PROPOSING, got.GetTask().GetStatus())

	// The same key, now for a usable repository: it was left unused, and the
	// owner's one dispatch of the day is still there to spend.
	resp, err := a.client.CreateTask(ctx, &taskrunnerv1.CreateTaskRequest{Repo: "acme/widgets", BaseBranch: "main", Prompt: "do it",
		Dispatch: true, RequestId: "key-acme/widgetsrelease-9"})
	require.NoError(t, err)
	require.Equal(t, taskrunnerv1.TaskStatus_TASK_STATUS_RUNNING, resp.GetTask().GetStatus())
	require.Eventually(t, func() bool {
		b, _ := os.ReadFile(a.starts)
		return strings.TrimSpace(string(b)) == resp.GetTask().GetId()
	}, 10*time.Second, 20*time.Millisecond, "the admitted task's runner starts")

	// Answers are cached per repository and branch: a second create asks
	// GitHub nothing more.
	require.Equal(t, 1, a.branchReads("/repos/acme/widgets/branches/main"))
	_, err = a.client.CreateTask(ctx, &taskrunnerv1.CreateTaskRequest{Repo: "acme/widgets", Prompt: "again"})
	require.NoError(t, err)
	require.Equal(t, 1, a.branchReads("/repos/acme/widgets/branches/main"))
	require.Equal(t, 1, a.branchReads("/repos/acme/widgets/branches/release-9"), "refusals are cached too")
}
