package task_test

import (
	"context"
	"log/slog"
	"math"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"

	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
	"github.com/taskrunner/taskrunner/services/auth"
	"github.com/taskrunner/taskrunner/services/rpcserver"
	"github.com/taskrunner/taskrunner/services/store/storetest"
	"github.com/taskrunner/taskrunner/services/task"
)

func newBudgetEnv(t *testing.T, b task.Budgets) *env {
	t.Helper()
	db := storetest.NewDB(t)
	tokens := auth.NewStore(db.Pool)
	lg := slog.New(slog.DiscardHandler)
	srv := rpcserver.New(rpcserver.Options{Logger: lg, Auth: tokens})
	ts := task.New(task.NewStore(db.Pool), nil, lg)
	ts.SetBudgets(b)
	taskrunnerv1.RegisterTaskServiceServer(srv, ts)
	lis := bufconn.Listen(1 << 20)
	go func() { _ = srv.Serve(lis) }()
	conn, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(); srv.Stop() })
	e := &env{db: db, client: taskrunnerv1.NewTaskServiceClient(conn), tokens: map[string]string{}}
	for _, owner := range []string{"alice", "bob"} {
		tok, _, err := tokens.Create(context.Background(), owner, nil, "test")
		require.NoError(t, err)
		e.tokens[owner] = tok
	}
	return e
}

func TestBudgetAtCreate(t *testing.T) {
	e := newBudgetEnv(t, task.Budgets{MaxBudgetUSD: 3, OwnerDailyUSD: 10})
	ctx := e.as("alice")
	create := func(usd float64) (*taskrunnerv1.Task, error) {
		resp, err := e.client.CreateTask(ctx, &taskrunnerv1.CreateTaskRequest{Repo: "acme/widgets", Prompt: "p", MaxBudgetUsd: usd})
		return resp.GetTask(), err
	}

	for _, bad := range []float64{3.01, 100, -1, math.NaN(), math.Inf(1)} {
		_, err := create(bad)
		requireCode(t, err, codes.InvalidArgument, "max_budget_usd: ")
		if bad > 3 && !math.IsInf(bad, 0) {
			requireCode(t, err, codes.InvalidArgument, "more than the server's maximum of 3.00 USD")
		}
	}
	require.Zero(t, e.count(t, "tasks"), "a refused budget stores nothing")

	for _, tc := range []struct{ set, want float64 }{{1.25, 1.25}, {3, 3}, {0, 3}} {
		tk, err := create(tc.set)
		require.NoError(t, err)
		require.Equal(t, tc.want, tk.GetMaxBudgetUsd(), "create answer, set %v", tc.set)
		got, err := e.client.GetTask(ctx, &taskrunnerv1.GetTaskRequest{Id: tk.GetId()})
		require.NoError(t, err)
		require.Equal(t, tc.want, got.GetTask().GetMaxBudgetUsd(), "GetTask, set %v", tc.set)
		stored, err := task.NewStore(e.db.Pool).Budget(context.Background(), tk.GetId())
		require.NoError(t, err)
		require.Equal(t, tc.set, stored, "the column keeps what was set (0: none)")
	}
	list, err := e.client.ListTasks(ctx, &taskrunnerv1.ListTasksRequest{})
	require.NoError(t, err)
	var budgets []float64
	for _, tk := range list.GetTasks() {
		budgets = append(budgets, tk.GetMaxBudgetUsd())
	}
	require.Equal(t, []float64{3, 3, 1.25}, budgets, "ListTasks shows each task's budget, newest first")

	// A retry keeps the budget.
	small := list.GetTasks()[2]
	require.Equal(t, 1.25, small.GetMaxBudgetUsd())
	_, err = e.client.CancelTask(ctx, &taskrunnerv1.CancelTaskRequest{Id: small.GetId()})
	require.NoError(t, err)
	retried, err := e.client.RetryTask(ctx, &taskrunnerv1.RetryTaskRequest{Id: small.GetId()})
	require.NoError(t, err)
	require.Equal(t, 1.25, retried.GetTask().GetMaxBudgetUsd())

	_, err = task.NewStore(e.db.Pool).Budget(context.Background(), "00000000-0000-0000-0000-000000000000")
	require.ErrorContains(t, err, "not found")
	// The server's maximum bounds a stored budget too (when it was lowered after create).
	require.Equal(t, 1.0, task.EffectiveBudget(1.25, 1))
	require.Equal(t, 0.5, task.EffectiveBudget(0.5, 1))
	require.Equal(t, 1.0, task.EffectiveBudget(0, 1))
}

func TestOwnerQuotaOnGetTask(t *testing.T) {
	e := newBudgetEnv(t, task.Budgets{MaxBudgetUSD: 5, OwnerDailyUSD: 10})
	ctx := e.as("alice")
	var ids []string
	for range 2 {
		resp, err := e.client.CreateTask(ctx, &taskrunnerv1.CreateTaskRequest{Repo: "acme/widgets", Prompt: "p"})
		require.NoError(t, err)
		ids = append(ids, resp.GetTask().GetId())
	}
	bobs, err := e.client.CreateTask(e.as("bob"), &taskrunnerv1.CreateTaskRequest{Repo: "acme/widgets", Prompt: "p"})
	require.NoError(t, err)
	// Spend as the model proxy records it on the timeline: a usage event with
	// the run's totals (the row's cost_usd, which holds only the current
	// run's, is not what counts). ids[0] has a second run (a follow-up).
	store := task.NewStore(e.db.Pool)
	spend := func(id string, usd float64) {
		require.NoError(t, store.InTx(context.Background(), func(tx *task.Tx) error {
			return tx.Append(context.Background(), id, &taskrunnerv1.Event{Payload: &taskrunnerv1.Event_Usage{Usage: &taskrunnerv1.Usage{CostUsd: usd}}})
		}))
	}
	spend(ids[0], 0.5)
	spend(ids[0], 1.0) // the run's total grows: the last usage of a run counts
	_, err = e.db.Pool.Exec(context.Background(), `INSERT INTO task_runs (task_id, number, trigger, state) VALUES ($1, 2, 'api', 'running')`, ids[0])
	require.NoError(t, err)
	_, err = e.db.Pool.Exec(context.Background(), `UPDATE tasks SET run = 2 WHERE id = $1`, ids[0])
	require.NoError(t, err)
	spend(ids[0], 0.5)
	spend(ids[1], 0.25)
	spend(bobs.GetTask().GetId(), 7)
	got, err := e.client.GetTask(ctx, &taskrunnerv1.GetTaskRequest{Id: ids[0]})
	require.NoError(t, err)
	q := got.GetTask().GetOwnerQuota()
	require.NotNil(t, q)
	require.Equal(t, 10.0, q.GetDailyUsd())
	require.InDelta(t, 1.75, q.GetSpentTodayUsd(), 1e-9, "alice's tasks only, every run: 1.0 + 0.5 + 0.25")
	reset := q.GetResetsTime().AsTime()
	require.Equal(t, time.Now().UTC().Truncate(24*time.Hour).Add(24*time.Hour), reset, "the next 00:00 UTC")

	none := newBudgetEnv(t, task.Budgets{MaxBudgetUSD: 5})
	resp, err := none.client.CreateTask(none.as("alice"), &taskrunnerv1.CreateTaskRequest{Repo: "acme/widgets", Prompt: "p"})
	require.NoError(t, err)
	got, err = none.client.GetTask(none.as("alice"), &taskrunnerv1.GetTaskRequest{Id: resp.GetTask().GetId()})
	require.NoError(t, err)
	require.Nil(t, got.GetTask().GetOwnerQuota(), "no quota configured: none shown")
}
