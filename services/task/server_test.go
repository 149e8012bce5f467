package task_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/taskrunner/taskrunner/platform/testkit"
	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
	"github.com/taskrunner/taskrunner/services/auth"
	"github.com/taskrunner/taskrunner/services/rpcserver"
	"github.com/taskrunner/taskrunner/services/store/storetest"
	"github.com/taskrunner/taskrunner/services/task"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/jackc/pgx/v5/pgxpool.(*Pool).backgroundHealthCheck"))
}

type env struct {
	db     *storetest.DB
	client taskrunnerv1.TaskServiceClient
	tokens map[string]string // owner → token
}

func newEnv(t *testing.T) *env {
	t.Helper()
	db := storetest.NewDB(t)
	tokens := auth.NewStore(db.Pool)
	lg := slog.New(slog.DiscardHandler)
	srv := rpcserver.New(rpcserver.Options{Logger: lg, Auth: tokens})
	taskrunnerv1.RegisterTaskServiceServer(srv, task.New(task.NewStore(db.Pool), nil, lg))
	conn := testkit.ServeConn(t, srv)
	e := &env{db: db, client: taskrunnerv1.NewTaskServiceClient(conn), tokens: map[string]string{}}
	for _, owner := range []string{"alice", "bob"} {
		tok, _, err := tokens.Create(context.Background(), owner, nil, "test")
		require.NoError(t, err)
		e.tokens[owner] = tok
	}
	tok, _, err := tokens.Create(context.Background(), "control-plane", []string{auth.ScopeInternal}, "internal")
	require.NoError(t, err)
	e.tokens["internal"] = tok
	return e
}

func (e *env) as(owner string) context.Context {
	return metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+e.tokens[owner])
}

func (e *env) count(t *testing.T, table string) int {
	var n int
	require.NoError(t, e.db.Pool.QueryRow(context.Background(), "SELECT count(*) FROM "+table).Scan(&n))
	return n
}

func requireCode(t *testing.T, err error, code codes.Code, contains string) {
	t.Helper()
	require.Error(t, err)
	st, ok := status.FromError(err)
	require.True(t, ok, "not a status: %v", err)
	require.Equal(t, code, st.Code(), st.Message())
	require.Contains(t, st.Message(), contains)
}

func TestCreateGetList(t *testing.T) {
	e := newEnv(t)
	ctx := e.as("alice")
	resp, err := e.client.CreateTask(ctx, &taskrunnerv1.CreateTaskRequest{Repo: "acme/widgets", Prompt: "Add a farewell flag"})
	require.NoError(t, err)
	tk := resp.GetTask()
	require.Equal(t, taskrunnerv1.TaskStatus_TASK_STATUS_PROPOSING, tk.GetStatus())
	require.Equal(t, "alice", tk.GetOwner())
	require.Equal(t, "main", tk.GetBaseBranch())
	require.Equal(t, "taskrunner/"+tk.GetId(), tk.GetHeadBranch())
	require.Equal(t, taskrunnerv1.Agent_AGENT_CLAUDE, tk.GetAgent())

	got, err := e.client.GetTask(ctx, &taskrunnerv1.GetTaskRequest{Id: tk.GetId()})
	require.NoError(t, err)
	require.Equal(t, tk.GetId(), got.GetTask().GetId())
	require.Equal(t, "Add a farewell flag", got.GetTask().GetPrompt())

	// Another owner sees NotFound, exactly like a missing task.
	_, err = e.client.GetTask(e.as("bob"), &taskrunnerv1.GetTaskRequest{Id: tk.GetId()})
	requireCode(t, err, codes.NotFound, tk.GetId())
	_, err = e.client.CancelTask(e.as("bob"), &taskrunnerv1.CancelTaskRequest{Id: tk.GetId()})
	requireCode(t, err, codes.NotFound, tk.GetId())

	for _, f := range []string{"proposing", "PROPOSING", "TASK_STATUS_PROPOSING"} {
		l, err := e.client.ListTasks(ctx, &taskrunnerv1.ListTasksRequest{Status: f})
		require.NoError(t, err)
		require.Len(t, l.GetTasks(), 1, f)
	}
	l, err := e.client.ListTasks(ctx, &taskrunnerv1.ListTasksRequest{Status: "done"})
	require.NoError(t, err)
	require.Empty(t, l.GetTasks())
	l, err = e.client.ListTasks(e.as("bob"), &taskrunnerv1.ListTasksRequest{})
	require.NoError(t, err)
	require.Empty(t, l.GetTasks())
}

// TestGetTaskViews: the basic view is the task as ListTasks shows it (no
// runs), with the same owner check; the full view, the default, has the
// runs; an unknown view is refused.
func TestGetTaskViews(t *testing.T) {
	e := newEnv(t)
	ctx := e.as("alice")
	resp, err := e.client.CreateTask(ctx, &taskrunnerv1.CreateTaskRequest{Repo: "acme/widgets", Prompt: "Add a farewell flag", MaxBudgetUsd: 1.5})
	require.NoError(t, err)
	id := resp.GetTask().GetId()

	full, err := e.client.GetTask(ctx, &taskrunnerv1.GetTaskRequest{Id: id})
	require.NoError(t, err)
	require.Len(t, full.GetTask().GetRuns(), 1, "the default view has the runs")
	explicit, err := e.client.GetTask(ctx, &taskrunnerv1.GetTaskRequest{Id: id, View: taskrunnerv1.TaskView_TASK_VIEW_FULL})
	require.NoError(t, err)
	require.True(t, proto.Equal(full.GetTask(), explicit.GetTask()))

	basic, err := e.client.GetTask(ctx, &taskrunnerv1.GetTaskRequest{Id: id, View: taskrunnerv1.TaskView_TASK_VIEW_BASIC})
	require.NoError(t, err)
	require.Empty(t, basic.GetTask().GetRuns())
	want := proto.Clone(full.GetTask()).(*taskrunnerv1.Task)
	want.Runs = nil
	require.True(t, proto.Equal(want, basic.GetTask()), "basic is full without the runs:\n%v\n%v", want, basic.GetTask())
	require.Equal(t, 1.5, basic.GetTask().GetMaxBudgetUsd())
	listed, err := e.client.ListTasks(ctx, &taskrunnerv1.ListTasksRequest{})
	require.NoError(t, err)
	require.True(t, proto.Equal(listed.GetTasks()[0], basic.GetTask()), "basic is what ListTasks shows")

	_, err = e.client.GetTask(e.as("bob"), &taskrunnerv1.GetTaskRequest{Id: id, View: taskrunnerv1.TaskView_TASK_VIEW_BASIC})
	requireCode(t, err, codes.NotFound, id)
	_, err = e.client.GetTask(ctx, &taskrunnerv1.GetTaskRequest{Id: id, View: taskrunnerv1.TaskView(7)})
	requireCode(t, err, codes.InvalidArgument, "view")
}

func TestListPagingNewestFirstAndFilters(t *testing.T) {
	e := newEnv(t)
	ctx := e.as("alice")
	var ids []string
	for i := range 7 {
		repo := "acme/a"
		if i%2 == 1 {
			repo = "acme/b"
		}
		r, err := e.client.CreateTask(ctx, &taskrunnerv1.CreateTaskRequest{Repo: repo, Prompt: fmt.Sprint("p", i)})
		require.NoError(t, err)
		ids = append(ids, r.GetTask().GetId())
	}
	var seen []string
	tok := ""
	for {
		l, err := e.client.ListTasks(ctx, &taskrunnerv1.ListTasksRequest{PageSize: 3, PageToken: tok})
		require.NoError(t, err)
		require.LessOrEqual(t, len(l.GetTasks()), 3)
		for _, tk := range l.GetTasks() {
			seen = append(seen, tk.GetId())
		}
		if tok = l.GetNextPageToken(); tok == "" {
			break
		}
	}
	for i, j := 0, len(ids)-1; i < j; i, j = i+1, j-1 {
		ids[i], ids[j] = ids[j], ids[i]
	}
	require.Equal(t, ids, seen, "all tasks, newest first, each once")

	l, err := e.client.ListTasks(ctx, &taskrunnerv1.ListTasksRequest{Repo: "acme/b"})
	require.NoError(t, err)
	require.Len(t, l.GetTasks(), 3)
	for _, tk := range l.GetTasks() {
		require.Equal(t, "acme/b", tk.GetRepo())
	}
}

func TestBadInputWritesNothing(t *testing.T) {
	e := newEnv(t)
	ctx := e.as("alice")
	cases := []struct {
		name  string
		req   *taskrunnerv1.CreateTaskRequest
		field string
	}{
		{"missing prompt", &taskrunnerv1.CreateTaskRequest{Repo: "a/b"}, "prompt"},
		{"empty prompt", &taskrunnerv1.CreateTaskRequest{Repo: "a/b", Prompt: " \n"}, "prompt"},
		{"prompt over 32 KiB", &taskrunnerv1.CreateTaskRequest{Repo: "a/b", Prompt: strings.Repeat("x", 32<<10+1)}, "prompt"},
		{"repo not owner/name", &taskrunnerv1.CreateTaskRequest{Repo: "widgets", Prompt: "p"}, "repo"},
		{"malformed branch", &taskrunnerv1.CreateTaskRequest{Repo: "a/b", Prompt: "p", BaseBranch: "feature..x"}, "base_branch"},
		{"unknown agent", &taskrunnerv1.CreateTaskRequest{Repo: "a/b", Prompt: "p", Agent: 42}, "agent"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.client.CreateTask(ctx, tc.req)
			requireCode(t, err, codes.InvalidArgument, tc.field+":")
			require.Zero(t, e.count(t, "tasks"))
		})
	}
	_, err := e.client.GetTask(ctx, &taskrunnerv1.GetTaskRequest{Id: "not-a-uuid"})
	requireCode(t, err, codes.InvalidArgument, "id:")
	_, err = e.client.ListTasks(ctx, &taskrunnerv1.ListTasksRequest{Status: "sleeping"})
	requireCode(t, err, codes.InvalidArgument, "status:")
	_, err = e.client.ListTasks(ctx, &taskrunnerv1.ListTasksRequest{PageToken: "garbage"})
	requireCode(t, err, codes.InvalidArgument, "page_token:")

	// No token, a wrong token, a malformed header.
	_, err = e.client.CreateTask(context.Background(), &taskrunnerv1.CreateTaskRequest{Repo: "a/b", Prompt: "p"})
	requireCode(t, err, codes.Unauthenticated, "bearer")
	wrong := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer trt_notarealtokennotarealtoken")
	_, err = e.client.CreateTask(wrong, &taskrunnerv1.CreateTaskRequest{Repo: "a/b", Prompt: "p"})
	requireCode(t, err, codes.Unauthenticated, "invalid bearer token")
	basic := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Basic Zm9vOmJhcg==")
	_, err = e.client.ListTasks(basic, &taskrunnerv1.ListTasksRequest{})
	requireCode(t, err, codes.Unauthenticated, "Bearer")
	require.Zero(t, e.count(t, "tasks"))
}

func TestIdempotentCreate(t *testing.T) {
	e := newEnv(t)
	ctx := e.as("alice")
	req := &taskrunnerv1.CreateTaskRequest{Repo: "acme/widgets", Prompt: "same", RequestId: "key-1"}
	var wg sync.WaitGroup
	ids := make([]string, 20)
	errsOut := make([]error, 20)
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := e.client.CreateTask(ctx, req)
			errsOut[i] = err
			if err == nil {
				ids[i] = r.GetTask().GetId()
			}
		}()
	}
	wg.Wait()
	for i := range 20 {
		require.NoError(t, errsOut[i])
		require.Equal(t, ids[0], ids[i])
	}
	require.Equal(t, 1, e.count(t, "tasks"))

	// The same key from the REST header path (metadata) returns the same task.
	md := metadata.AppendToOutgoingContext(ctx, "idempotency-key", "key-1")
	r, err := e.client.CreateTask(md, &taskrunnerv1.CreateTaskRequest{Repo: "acme/widgets", Prompt: "same"})
	require.NoError(t, err)
	require.Equal(t, ids[0], r.GetTask().GetId())

	// Reusing the key for a different request is refused and writes nothing.
	_, err = e.client.CreateTask(ctx, &taskrunnerv1.CreateTaskRequest{Repo: "acme/widgets", Prompt: "different", RequestId: "key-1"})
	requireCode(t, err, codes.AlreadyExists, "key-1")
	// Another owner may use the same key independently.
	_, err = e.client.CreateTask(e.as("bob"), req)
	require.NoError(t, err)
	require.Equal(t, 2, e.count(t, "tasks"))
}

func TestCancelAndRetry(t *testing.T) {
	e := newEnv(t)
	ctx := e.as("alice")
	r, err := e.client.CreateTask(ctx, &taskrunnerv1.CreateTaskRequest{Repo: "acme/widgets", Prompt: "p", BaseBranch: "dev"})
	require.NoError(t, err)
	id := r.GetTask().GetId()
	_, err = e.client.RetryTask(ctx, &taskrunnerv1.RetryTaskRequest{Id: id})
	requireCode(t, err, codes.FailedPrecondition, "only failed or cancelled")

	c, err := e.client.CancelTask(ctx, &taskrunnerv1.CancelTaskRequest{Id: id, Reason: "changed my mind"})
	require.NoError(t, err)
	require.Equal(t, taskrunnerv1.TaskStatus_TASK_STATUS_CANCELLED, c.GetTask().GetStatus())
	require.Equal(t, "changed my mind", c.GetTask().GetFailedReason())
	_, err = e.client.CancelTask(ctx, &taskrunnerv1.CancelTaskRequest{Id: id})
	requireCode(t, err, codes.FailedPrecondition, "no further changes")

	rt, err := e.client.RetryTask(ctx, &taskrunnerv1.RetryTaskRequest{Id: id})
	require.NoError(t, err)
	require.NotEqual(t, id, rt.GetTask().GetId())
	require.Equal(t, id, rt.GetTask().GetRetryOf())
	require.Equal(t, "dev", rt.GetTask().GetBaseBranch())
	require.Equal(t, taskrunnerv1.TaskStatus_TASK_STATUS_PROPOSING, rt.GetTask().GetStatus())
	old, err := e.client.GetTask(ctx, &taskrunnerv1.GetTaskRequest{Id: id})
	require.NoError(t, err)
	require.Equal(t, taskrunnerv1.TaskStatus_TASK_STATUS_CANCELLED, old.GetTask().GetStatus(), "retry never mutates the old task")
}

// snapshot reads the whole task row so tests can prove nothing changed.
func snapshot(t *testing.T, e *env, id string) task.Task {
	tk, err := task.NewStore(e.db.Pool).Get(context.Background(), id, "")
	require.NoError(t, err)
	return tk
}

func TestAdvanceTask(t *testing.T) {
	e := newEnv(t)
	r, err := e.client.CreateTask(e.as("alice"), &taskrunnerv1.CreateTaskRequest{Repo: "acme/widgets", Prompt: "p"})
	require.NoError(t, err)
	id := r.GetTask().GetId()
	in := e.as("internal")
	adv := func(req *taskrunnerv1.AdvanceTaskRequest) (*taskrunnerv1.AdvanceTaskResponse, error) {
		req.TaskId = id
		return e.client.AdvanceTask(in, req)
	}

	// Only internal callers may advance.
	_, err = e.client.AdvanceTask(e.as("alice"), &taskrunnerv1.AdvanceTaskRequest{TaskId: id, Status: taskrunnerv1.TaskStatus_TASK_STATUS_QUEUED})
	requireCode(t, err, codes.PermissionDenied, "internal")

	// Running without dispatch is refused and changes nothing.
	before := snapshot(t, e, id)
	_, err = adv(&taskrunnerv1.AdvanceTaskRequest{Seq: 1, Status: taskrunnerv1.TaskStatus_TASK_STATUS_RUNNING})
	requireCode(t, err, codes.FailedPrecondition, "never dispatched")
	_, err = adv(&taskrunnerv1.AdvanceTaskRequest{Seq: 1, Stage: taskrunnerv1.TaskStage_TASK_STAGE_EXPLORE})
	requireCode(t, err, codes.FailedPrecondition, "only while running")
	require.Equal(t, before, snapshot(t, e, id))

	resp, err := adv(&taskrunnerv1.AdvanceTaskRequest{RequestId: "queue-1", Status: taskrunnerv1.TaskStatus_TASK_STATUS_QUEUED})
	require.NoError(t, err)
	require.True(t, resp.GetApplied())
	require.Equal(t, taskrunnerv1.TaskStatus_TASK_STATUS_QUEUED, resp.GetTask().GetStatus())
	// The same request id again is a no-op.
	resp, err = adv(&taskrunnerv1.AdvanceTaskRequest{RequestId: "queue-1", Status: taskrunnerv1.TaskStatus_TASK_STATUS_QUEUED})
	require.NoError(t, err)
	require.False(t, resp.GetApplied())

	// Dispatch records a sandbox; then running is legal.
	_, err = e.db.Pool.Exec(context.Background(), "INSERT INTO sandboxes (task_id, provider, external_id) VALUES ($1, 'process', 'x')", id)
	require.NoError(t, err)
	_, err = adv(&taskrunnerv1.AdvanceTaskRequest{RequestId: "run-1", Status: taskrunnerv1.TaskStatus_TASK_STATUS_RUNNING})
	require.NoError(t, err)

	stages := []taskrunnerv1.TaskStage{taskrunnerv1.TaskStage_TASK_STAGE_EXPLORE, taskrunnerv1.TaskStage_TASK_STAGE_PROPOSE,
		taskrunnerv1.TaskStage_TASK_STAGE_APPLY, taskrunnerv1.TaskStage_TASK_STAGE_ARCHIVE}
	for i, sg := range stages {
		resp, err := adv(&taskrunnerv1.AdvanceTaskRequest{Seq: int64(i + 1), Stage: sg})
		require.NoError(t, err)
		require.True(t, resp.GetApplied())
		require.Equal(t, sg, resp.GetTask().GetStage())
		require.Equal(t, int64(i+1), resp.GetTask().GetLastSeq())
	}
	// Repeating seq 2 (even with a now-illegal stage) is a no-op, not an error.
	resp, err = adv(&taskrunnerv1.AdvanceTaskRequest{Seq: 2, Stage: taskrunnerv1.TaskStage_TASK_STAGE_PROPOSE})
	require.NoError(t, err)
	require.False(t, resp.GetApplied())
	require.Equal(t, taskrunnerv1.TaskStage_TASK_STAGE_ARCHIVE, resp.GetTask().GetStage())
	// A new seq moving the stage backward is refused and changes nothing.
	before = snapshot(t, e, id)
	_, err = adv(&taskrunnerv1.AdvanceTaskRequest{Seq: 5, Stage: taskrunnerv1.TaskStage_TASK_STAGE_APPLY})
	requireCode(t, err, codes.FailedPrecondition, "only move forward")
	require.Equal(t, before, snapshot(t, e, id))

	resp, err = adv(&taskrunnerv1.AdvanceTaskRequest{Seq: 6, DiffStats: &taskrunnerv1.DiffStats{Additions: 12, Deletions: 3, FilesChanged: 4},
		Usage: &taskrunnerv1.Usage{CostUsd: 0.42, TokensIn: 1000, TokensOut: 200}, Heartbeat: true})
	require.NoError(t, err)
	require.Equal(t, int64(12), resp.GetTask().GetDiffStats().GetAdditions())
	require.InDelta(t, 0.42, resp.GetTask().GetUsage().GetCostUsd(), 1e-9)
	require.NotNil(t, resp.GetTask().GetHeartbeatTime())

	resp, err = adv(&taskrunnerv1.AdvanceTaskRequest{Seq: 7, Status: taskrunnerv1.TaskStatus_TASK_STATUS_AWAITING_REVIEW, PrUrl: "http://forge/acme/widgets/pull/1", PrNumber: 1})
	require.NoError(t, err)
	require.Equal(t, taskrunnerv1.TaskStatus_TASK_STATUS_AWAITING_REVIEW, resp.GetTask().GetStatus())
	resp, err = adv(&taskrunnerv1.AdvanceTaskRequest{RequestId: "delivery-1", Status: taskrunnerv1.TaskStatus_TASK_STATUS_DONE})
	require.NoError(t, err)
	require.Equal(t, taskrunnerv1.TaskStatus_TASK_STATUS_DONE, resp.GetTask().GetStatus())
	resp, err = adv(&taskrunnerv1.AdvanceTaskRequest{RequestId: "delivery-1", Status: taskrunnerv1.TaskStatus_TASK_STATUS_DONE})
	require.NoError(t, err, "a replayed delivery is a no-op")
	require.False(t, resp.GetApplied())

	// Anything after a terminal status is refused and changes nothing.
	before = snapshot(t, e, id)
	for _, req := range []*taskrunnerv1.AdvanceTaskRequest{
		{Seq: 8, Status: taskrunnerv1.TaskStatus_TASK_STATUS_FAILED, FailedReason: "x"},
		{RequestId: "late", Status: taskrunnerv1.TaskStatus_TASK_STATUS_CANCELLED},
		{Seq: 9, Heartbeat: true},
	} {
		_, err = adv(req)
		requireCode(t, err, codes.FailedPrecondition, "no further changes")
	}
	require.Equal(t, before, snapshot(t, e, id))
	var n int
	require.NoError(t, e.db.Pool.QueryRow(context.Background(), "SELECT count(*) FROM task_requests WHERE task_id = $1 AND request_id = 'late'", id).Scan(&n))
	require.Zero(t, n, "a refused request id is not remembered")

	// Unknown task.
	_, err = e.client.AdvanceTask(in, &taskrunnerv1.AdvanceTaskRequest{TaskId: "00000000-0000-0000-0000-000000000000", Seq: 1, Heartbeat: true})
	requireCode(t, err, codes.NotFound, "not found")
}

func TestFailedReasonRedactedAndBounded(t *testing.T) {
	e := newEnv(t)
	r, err := e.client.CreateTask(e.as("alice"), &taskrunnerv1.CreateTaskRequest{Repo: "acme/widgets", Prompt: "p"})
	require.NoError(t, err)
	secret := "ghs_" + strings.Repeat("A", 36)
	resp, err := e.client.AdvanceTask(e.as("internal"), &taskrunnerv1.AdvanceTaskRequest{TaskId: r.GetTask().GetId(), RequestId: "f",
		Status: taskrunnerv1.TaskStatus_TASK_STATUS_FAILED, FailedReason: "push failed with " + secret + strings.Repeat(" more", 500)})
	require.NoError(t, err)
	require.NotContains(t, resp.GetTask().GetFailedReason(), secret)
	require.LessOrEqual(t, len(resp.GetTask().GetFailedReason()), task.MaxReasonBytes)
}
