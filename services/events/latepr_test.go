package events_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
	"github.com/taskrunner/taskrunner/services/task"
)

// A deadline passed while the control plane was down (issue 19): the
// reaper failed the task "timeout" first, then the runner reconnects with
// its buffered events, the last one failed{pr_url} of the draft pull
// request it salvaged. The pull request lands on the task row, the status
// and reason stay as the reaper decided, the runner's events join the
// timeline after the final status change without a gap, and from then on
// the task refuses runners like any finished task.
func TestSalvagedPullRequestIsRecordedOnAFailedTask(t *testing.T) {
	e := newEnv(t)
	in := e.start(t, "127.0.0.1:0")
	id := e.runningTask(t, "alice")
	ctx := context.Background()
	c := e.runner(t, in.addr, id)
	sendAll(t, c, []*taskrunnerv1.Event{stage(taskrunnerv1.TaskStage_TASK_STAGE_EXPLORE), logLine("working")})
	in.stop() // the control plane goes down; the runner works on

	_, applied, err := e.tasks.Advance(ctx, id, "", task.Advance{RequestID: "reaper:timeout", Status: task.StatusFailed,
		FailedReason: "timeout", Actor: task.ActorReaper})
	require.NoError(t, err)
	require.True(t, applied)
	const pr = "https://github.com/acme/widgets/pull/9"
	for _, ev := range []*taskrunnerv1.Event{logLine("deadline: saving work"), failed("deadline exceeded", pr)} {
		_, err := c.Send(ev)
		require.NoError(t, err)
	}
	e.start(t, in.addr) // back, and the reaper has decided first
	require.Eventually(t, func() bool { return c.Acked() == 4 }, 20*time.Second, 5*time.Millisecond)

	tk := e.task(t, id)
	require.Equal(t, task.StatusFailed, tk.Status)
	require.Equal(t, "timeout", tk.FailedReason, "the reaper's decision stands")
	require.Equal(t, pr, tk.PRURL)
	require.EqualValues(t, 9, tk.PRNumber)
	n, distinct, lo, hi := e.storedSeqs(t, id) // also: gap-free 1..N
	require.Equal(t, [4]int64{4, 4, 1, 4}, [4]int64{n, distinct, lo, hi})
	var types []string
	rows, err := e.db.Pool.Query(ctx, `SELECT type FROM task_events WHERE task_id = $1 ORDER BY seq`, id)
	require.NoError(t, err)
	for rows.Next() {
		var typ string
		require.NoError(t, rows.Scan(&typ))
		types = append(types, typ)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, []string{"status_change", "status_change", "stage_change", "log", "status_change", "log", "failed"}, types)

	// Recorded: the task is finished for runners now.
	_, _, err = rawStream(t, in.addr, e.runnerTLS(t, e.ca, id, time.Now().Add(time.Hour)), id, taskrunnerv1.ProtocolVersion_PROTOCOL_VERSION_1)
	requireFinished(t, err, "4")
}

// A cancelled task (or one whose pull request is known) takes no late
// runner: RecordPR is only for a failed task without a pull request.
func TestLateRunnerRefusedUnlessFailedWithoutPullRequest(t *testing.T) {
	e := newEnv(t)
	in := e.start(t, "127.0.0.1:0")
	ctx := context.Background()
	id := e.runningTask(t, "alice")
	_, _, err := e.tasks.Advance(ctx, id, "", task.Advance{RequestID: "cancel", Status: task.StatusCancelled, FailedReason: "user", Actor: task.UserActor("alice")})
	require.NoError(t, err)
	_, _, err = rawStream(t, in.addr, e.runnerTLS(t, e.ca, id, time.Now().Add(time.Hour)), id, taskrunnerv1.ProtocolVersion_PROTOCOL_VERSION_1)
	requireFinished(t, err, "0")

	_, err = task.RecordPR(e.task(t, id), "https://x/pull/1", 1, 1)
	require.Error(t, err)
}

func requireFinished(t *testing.T, err error, last string) {
	t.Helper()
	require.Equal(t, codes.FailedPrecondition, status.Code(err), "%v", err)
	st, _ := status.FromError(err)
	var info *errdetails.ErrorInfo
	for _, d := range st.Details() {
		if i, ok := d.(*errdetails.ErrorInfo); ok {
			info = i
		}
	}
	require.NotNil(t, info)
	require.Equal(t, "TASK_FINISHED", info.GetReason())
	require.Equal(t, last, info.GetMetadata()["last_persisted_seq"])
}
