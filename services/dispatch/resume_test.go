package dispatch

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/taskrunner/taskrunner/services/task"
)

// A Dispatch killed between the admission's commit and Provider.Create
// (issue 19): the task is running, its sandbox row 'creating' with no
// external id, no sandbox exists. The next Dispatch starts it once, and
// leaves alone the tasks it has no business starting.
func TestResumeStartsSandboxesAdmittedBeforeARestart(t *testing.T) {
	h := newHarness(t)
	cfg := testConfig()
	killed := h.server(t, cfg, "sb")
	ctx := context.Background()

	// admit commits exactly what DispatchTask commits, and stops where a
	// kill -9 would: before launch.
	admit := func(id string) {
		require.NoError(t, killed.tasks.InTx(ctx, func(tx *task.Tx) error {
			_, err := killed.admitTx(ctx, tx, id, task.UserActor("alice"), "admitted")
			return err
		}))
	}
	stranded := []string{h.create(t, "alice", "acme/a"), h.create(t, "alice", "acme/b")}
	for _, id := range stranded {
		admit(id)
	}
	cancelled := h.create(t, "alice", "acme/c") // admitted, then cancelled while down
	admit(cancelled)
	_, _, err := h.tasks.Advance(ctx, cancelled, "", task.Advance{RequestID: "x", Status: task.StatusCancelled})
	require.NoError(t, err)
	late := h.create(t, "alice", "acme/d") // admitted, and past its deadline by now: the reaper's
	admit(late)
	_, err = h.db.Pool.Exec(ctx, `UPDATE tasks SET deadline_at = now() - interval '1 second' WHERE id = $1`, late)
	require.NoError(t, err)
	require.Empty(t, h.startCount(t))

	restarted := h.server(t, cfg, "sb")
	n, err := restarted.Resume(ctx)
	require.NoError(t, err)
	require.Equal(t, 2, n)
	restarted.Wait()
	want := map[string]int{stranded[0]: 1, stranded[1]: 1}
	require.Eventually(t, func() bool { return len(h.startCount(t)) == 2 }, 10*time.Second, 10*time.Millisecond)
	require.Equal(t, want, h.startCount(t))
	for _, id := range stranded {
		require.Equal(t, task.StatusRunning, h.status(t, id))
		var ext, state string
		require.NoError(t, h.db.Pool.QueryRow(ctx, `SELECT external_id, state FROM sandboxes WHERE task_id = $1`, id).Scan(&ext, &state))
		require.NotEmpty(t, ext)
		require.NotEqual(t, "creating", state)
		var started int
		require.NoError(t, h.db.Pool.QueryRow(ctx,
			`SELECT count(*) FROM task_events WHERE task_id = $1 AND type = 'sandbox' AND payload->'sandbox'->>'state' = 'started'`, id).Scan(&started))
		require.Equal(t, 1, started, "the start is on the timeline once")
	}

	// Nothing left to resume, and a third Dispatch finds nothing either:
	// no task is started twice.
	n, err = restarted.Resume(ctx)
	require.NoError(t, err)
	require.Zero(t, n)
	n, err = h.server(t, cfg, "sb").Resume(ctx)
	require.NoError(t, err)
	require.Zero(t, n)
	require.Equal(t, want, h.startCount(t))

	// A sandbox row this server wrote itself (a start in flight here) is
	// not resumed.
	fresh := h.create(t, "alice", "acme/e")
	require.NoError(t, restarted.tasks.InTx(ctx, func(tx *task.Tx) error {
		_, err := restarted.admitTx(ctx, tx, fresh, task.UserActor("alice"), "admitted")
		return err
	}))
	n, err = restarted.Resume(ctx)
	require.NoError(t, err)
	require.Zero(t, n)
}

// After a failed reaper cycle (a database outage: no heartbeat could be
// recorded) the reaper waits a full silence window again before failing a
// silent task runner_lost.
func TestReaperGraceAfterAnOutage(t *testing.T) {
	h := newHarness(t)
	cfg := testConfig()
	cfg.HeartbeatInterval = time.Second
	s := h.server(t, cfg, "sb")
	ctx := context.Background()
	id := h.create(t, "alice", "acme/widgets")
	_, err := s.DispatchTask(ctx, id)
	require.NoError(t, err)
	s.Wait()
	h.silence(t, id)
	s.born = time.Now().Add(-time.Hour) // long past its start-up grace
	s.outage()
	res, err := s.Reap(ctx)
	require.NoError(t, err)
	require.Zero(t, res.Lost, "right after an outage the reaper does not judge silence")
	require.Equal(t, task.StatusRunning, h.status(t, id))
	s.born = time.Now().Add(-3 * cfg.HeartbeatInterval) // a window later
	res, err = s.Reap(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, res.Lost)
}
