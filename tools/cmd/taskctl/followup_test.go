package main

import (
	"context"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
	"github.com/taskrunner/taskrunner/services/auth"
	"github.com/taskrunner/taskrunner/services/dispatch"
	"github.com/taskrunner/taskrunner/services/pki"
	"github.com/taskrunner/taskrunner/services/rpcserver"
	"github.com/taskrunner/taskrunner/services/sandbox/process"
	"github.com/taskrunner/taskrunner/services/store/storetest"
	"github.com/taskrunner/taskrunner/services/task"
)

type dispatchServer struct {
	addr, token, starts string
	db                  *storetest.DB
	tasks               *task.Store
}

// serveWithDispatch runs TaskService with the real DispatchService (process
// provider; the runner is a script that records its run and sleeps) and
// returns the address, the store, alice's token and the runner's record.
func serveWithDispatch(t *testing.T) *dispatchServer {
	t.Helper()
	db := storetest.NewDB(t)
	lg := slog.New(slog.DiscardHandler)
	dir := t.TempDir()
	starts := filepath.Join(dir, "starts.txt")
	runner := filepath.Join(dir, "runner")
	require.NoError(t, os.WriteFile(runner, []byte("#!/bin/sh\necho \"$TASKRUNNER_TASK_ID run $TASKRUNNER_RUN\" >> \""+starts+"\"\nexec sleep 300\n"), 0o755))
	prov, err := process.New(process.Config{RunnerBin: runner, WorkRoot: filepath.Join(dir, "work"), Bwrap: "never", KillGrace: time.Second}, lg)
	require.NoError(t, err)
	ca, err := pki.NewCA("taskrunner.test", time.Hour)
	require.NoError(t, err)
	d, err := dispatch.New(dispatch.Config{PerOwnerPerDay: 20, PerRepoRunning: 3, GlobalRunning: 10, TaskTimeout: time.Hour,
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
	tasks := task.NewStore(db.Pool)
	tokens := auth.NewStore(db.Pool)
	srv := rpcserver.New(rpcserver.Options{Logger: lg, Auth: tokens})
	taskrunnerv1.RegisterTaskServiceServer(srv, task.New(tasks, d, lg))
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	token, _, err := tokens.Create(context.Background(), "alice", nil, "")
	require.NoError(t, err)
	return &dispatchServer{addr: lis.Addr().String(), token: token, starts: starts, db: db, tasks: tasks}
}

// awaitingReview creates alice's task and moves it to awaiting review with a
// PR, as its first run's runner would.
func (s *dispatchServer) awaitingReview(t *testing.T) string {
	t.Helper()
	ctx := context.Background()
	tasks := s.tasks
	tk, _, err := tasks.Create(ctx, task.NewTask{Owner: "alice", Repo: "acme/widgets", BaseBranch: "main", Prompt: "add a flag", Agent: task.AgentClaude}, "")
	require.NoError(t, err)
	_, err = s.db.Pool.Exec(ctx, `INSERT INTO sandboxes (task_id, provider, external_id, state) VALUES ($1, 'process', 'first', 'running')`, tk.ID)
	require.NoError(t, err)
	_, _, err = tasks.Advance(ctx, tk.ID, "", task.Advance{Status: task.StatusRunning, RequestID: "run-1"})
	require.NoError(t, err)
	_, _, err = tasks.Advance(ctx, tk.ID, "", task.Advance{Status: task.StatusAwaitingReview, PRURL: "https://github.example/acme/widgets/pull/7", PRNumber: 7, Seq: 1})
	require.NoError(t, err)
	return tk.ID
}

// TestTaskFollowUp: `taskctl task followup` records run 2 of a task awaiting
// review and Dispatch starts its runner; --json prints what the REST API
// answers ({task, run, created}); the same request id records nothing new;
// a task that never opened a PR is refused with the server's reason.
func TestTaskFollowUp(t *testing.T) {
	s := serveWithDispatch(t)
	id := s.awaitingReview(t)
	common := []string{"--addr", s.addr, "--token", s.token}

	out, err := taskctl(t, append(common, "--json", "task", "followup", id, "--prompt", "Also document the flag", "--request-id", "fu-1")...)
	require.NoError(t, err, out)
	resp := &taskrunnerv1.FollowUpTaskResponse{}
	requireRESTShape(t, out, resp)
	require.True(t, resp.GetCreated())
	require.Equal(t, int32(2), resp.GetRun().GetNumber())
	require.Equal(t, "Also document the flag", resp.GetRun().GetPrompt())
	require.Equal(t, "api", resp.GetRun().GetTrigger())
	require.Equal(t, "user:alice", resp.GetRun().GetRequestedBy())
	require.Equal(t, "running", resp.GetRun().GetState())
	require.Equal(t, taskrunnerv1.TaskStatus_TASK_STATUS_RUNNING, resp.GetTask().GetStatus())
	require.Len(t, resp.GetTask().GetRuns(), 2)
	require.Eventually(t, func() bool {
		b, _ := os.ReadFile(s.starts)
		return strings.TrimSpace(string(b)) == id+" run 2"
	}, 10*time.Second, 20*time.Millisecond, "Dispatch starts run 2's runner")

	// The same request id: the same run, nothing new; in text.
	out, err = taskctl(t, append(common, "task", "followup", id, "--prompt", "Also document the flag", "--request-id", "fu-1")...)
	require.NoError(t, err, out)
	require.Contains(t, out, "run 2 already recorded (same request id): running")
	require.Contains(t, out, "run 1:")
	require.Contains(t, out, "run 2:")
	require.Contains(t, out, "Also document the flag")

	// Refusals come from the server, with its reason.
	fresh, _, err := s.tasks.Create(context.Background(), task.NewTask{Owner: "alice", Repo: "acme/widgets", BaseBranch: "main", Prompt: "p", Agent: task.AgentClaude}, "")
	require.NoError(t, err)
	_, err = taskctl(t, append(common, "task", "followup", fresh.ID, "--prompt", "more")...)
	require.ErrorContains(t, err, "FailedPrecondition")
	_, err = taskctl(t, append(common, "task", "followup", id)...)
	require.ErrorContains(t, err, "--prompt")
}
