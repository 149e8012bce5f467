package events

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/taskrunner/taskrunner/platform/eventwire"
	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
	"github.com/taskrunner/taskrunner/services/errs"
	"github.com/taskrunner/taskrunner/services/store/storetest"
	"github.com/taskrunner/taskrunner/services/task"
)

// committerEnv is a committer on a database and Redis of its own, with
// helpers to build its input.
type committerEnv struct {
	t     *testing.T
	ctx   context.Context
	db    *storetest.DB
	rds   *storetest.Redis
	tasks *task.Store
	cfg   Config
}

func newCommitterEnv(t *testing.T) *committerEnv {
	db := storetest.NewDB(t)
	rds := storetest.NewRedis(t)
	return &committerEnv{t: t, ctx: context.Background(), db: db, rds: rds, tasks: task.NewStore(db.Pool),
		cfg: Config{TrustDomain: "t.dev", RedisPrefix: rds.Prefix}.withDefaults()}
}

// committer is a new committer (each one stands for another replica).
func (e *committerEnv) committer() *committer {
	return newCommitter(e.cfg, e.db.Pool, slog.New(slog.DiscardHandler))
}

// running creates a task of alice's and moves it to running as Dispatch does.
func (e *committerEnv) running() string {
	tk, _, err := e.tasks.Create(e.ctx, task.NewTask{Owner: "alice", Repo: "acme/widgets", BaseBranch: "main", Prompt: "p", Agent: task.AgentClaude}, "")
	require.NoError(e.t, err)
	_, err = e.db.Pool.Exec(e.ctx, `INSERT INTO sandboxes (task_id, provider) VALUES ($1, 'process')`, tk.ID)
	require.NoError(e.t, err)
	_, _, err = e.tasks.Advance(e.ctx, tk.ID, "", task.Advance{Status: task.StatusRunning, RequestID: "d"})
	require.NoError(e.t, err)
	return tk.ID
}

// sub numbers ev and makes it the committer's work, as Connect does.
func (e *committerEnv) sub(id string, s *sink, seq int64, ev *taskrunnerv1.Event) *submission {
	ev.Seq = seq
	body, err := eventwire.EncodeBody(ev)
	require.NoError(e.t, err)
	return &submission{taskID: id, ev: ev, typ: eventwire.TypeName(ev), body: body, sink: s}
}

// count is the number of runner events stored for a task.
func (e *committerEnv) count(id string) (n int64) {
	require.NoError(e.t, e.db.Pool.QueryRow(e.ctx, `SELECT count(*) FROM task_events WHERE task_id = $1 AND runner_seq IS NOT NULL`, id).Scan(&n))
	return n
}

func stageEv(s taskrunnerv1.TaskStage) *taskrunnerv1.Event {
	return &taskrunnerv1.Event{Payload: &taskrunnerv1.Event_StageChange{StageChange: &taskrunnerv1.StageChange{Stage: s}}}
}

func lineEv() *taskrunnerv1.Event {
	return &taskrunnerv1.Event{Payload: &taskrunnerv1.Event_Log{Log: &taskrunnerv1.Log{Lines: []string{"x"}}}}
}

// TestBatchRefusalIsolatesTasks commits one batch holding two tasks' events
// where one of task A's events breaks the state machine: A keeps what came
// before it, B is untouched by A's refusal, and only stored events are
// published.
func TestBatchRefusalIsolatesTasks(t *testing.T) {
	e := newCommitterEnv(t)
	ctx, tasks, sub, st, line, count := e.ctx, e.tasks, e.sub, stageEv, lineEv, e.count
	a, b := e.running(), e.running()
	c := e.committer()
	sinkA, sinkB := newSink(), newSink()
	batch := []*submission{
		sub(a, sinkA, 1, st(taskrunnerv1.TaskStage_TASK_STAGE_EXPLORE)),
		sub(b, sinkB, 1, st(taskrunnerv1.TaskStage_TASK_STAGE_EXPLORE)),
		sub(a, sinkA, 2, st(taskrunnerv1.TaskStage_TASK_STAGE_APPLY)),
		sub(a, sinkA, 3, st(taskrunnerv1.TaskStage_TASK_STAGE_PROPOSE)), // backward: refused
		sub(b, sinkB, 2, line()),
		sub(a, sinkA, 4, line()), // follows a refused event: a gap
		{taskID: b, sink: sinkB}, // heartbeat
		sub(b, sinkB, 3, st(taskrunnerv1.TaskStage_TASK_STAGE_PROPOSE)),
	}
	c.commit(batch)

	ackA, errA := sinkA.state()
	require.Equal(t, int64(2), ackA)
	require.ErrorIs(t, errA, errs.ErrInvalidTransition)
	st0, _ := errs.ToStatus(errA)
	require.Equal(t, codes.FailedPrecondition, st0.Code())
	require.Contains(t, status.Convert(st0.Err()).Message(), "stages only move forward")
	ackB, errB := sinkB.state()
	require.Equal(t, int64(3), ackB)
	require.NoError(t, errB)

	ta, err := tasks.Get(ctx, a, "")
	require.NoError(t, err)
	require.Equal(t, task.StageApply, ta.Stage)
	tb, err := tasks.Get(ctx, b, "")
	require.NoError(t, err)
	require.Equal(t, task.StagePropose, tb.Stage)
	require.NotNil(t, tb.HeartbeatAt)
	require.WithinDuration(t, time.Now(), *tb.HeartbeatAt, time.Minute)

	require.Equal(t, int64(2), count(a))
	require.Equal(t, int64(3), count(b))

	// Published in seq order per task (tasks are committed in id order).
	pubs := <-c.publish
	got := map[string][]int64{}
	for _, p := range pubs {
		msg, err := eventwire.DecodeMessage(p.Message())
		require.NoError(t, err)
		ev, err := eventwire.DecodeEvent(msg.Payload)
		require.NoError(t, err)
		require.Equal(t, msg.Seq, ev.GetSeq())
		require.Equal(t, eventwire.TypeName(ev), msg.Type)
		got[p.TaskID] = append(got[p.TaskID], ev.GetSeq())
	}
	// Each timeline already holds created (1) and running (2).
	require.Equal(t, map[string][]int64{a: {3, 4}, b: {3, 4, 5}}, got)
}

// TestFailedBatchCommitsNothing breaks the second round trip of a batch
// (a payload PostgreSQL cannot parse): nothing of the batch is stored, every
// stream is told to resend, and the pool's next batch commits normally.
func TestFailedBatchCommitsNothing(t *testing.T) {
	e := newCommitterEnv(t)
	ctx, db, tasks := e.ctx, e.db, e.tasks
	id := e.running()
	c := e.committer()
	stage := &taskrunnerv1.Event{Seq: 1, Payload: &taskrunnerv1.Event_StageChange{StageChange: &taskrunnerv1.StageChange{Stage: taskrunnerv1.TaskStage_TASK_STAGE_EXPLORE}}}
	good, err := eventwire.EncodeBody(stage)
	require.NoError(t, err)
	s1 := newSink()
	c.commit([]*submission{{taskID: id, ev: stage, typ: eventwire.TypeName(stage), body: []byte("{not json"), sink: s1}})
	ack, err := s1.state()
	require.Zero(t, ack)
	st, _ := errs.ToStatus(err)
	require.Equal(t, codes.Unavailable, st.Code())
	require.Zero(t, e.count(id))
	got, err := tasks.Get(ctx, id, "")
	require.NoError(t, err)
	require.Equal(t, task.StageNone, got.Stage, "the stage change of the failed batch must not be committed")
	select {
	case p := <-c.publish:
		t.Fatalf("a failed batch published %d events", len(p))
	default:
	}

	// Every pooled connection is usable afterwards (none is left inside the
	// failed transaction), and the resent event is stored once.
	for range db.Pool.Config().MaxConns {
		s2 := newSink()
		c.commit([]*submission{{taskID: id, ev: stage, typ: eventwire.TypeName(stage), body: good, sink: s2}})
		ack, err = s2.state()
		require.NoError(t, err)
		require.Equal(t, int64(1), ack)
	}
	require.Equal(t, int64(1), e.count(id))
	got, err = tasks.Get(ctx, id, "")
	require.NoError(t, err)
	require.Equal(t, task.StageExplore, got.Stage)
	require.Equal(t, int64(1), got.LastSeq)
}

// TestCommitterNoticesTasksChangedBehindItsBack covers the one-round-trip
// path: the committer decides from what it wrote last, and a task moved by
// someone else meanwhile (a cancel through the API, another replica storing
// the runner's events) must be read afresh, not overwritten.
func TestCommitterNoticesTasksChangedBehindItsBack(t *testing.T) {
	e := newCommitterEnv(t)
	ctx, db, tasks, sub, stage, line, count := e.ctx, e.db, e.tasks, e.sub, stageEv, lineEv, e.count
	c := e.committer()
	other := e.committer() // another replica
	a, b := e.running(), e.running()
	sa, sb := newSink(), newSink()
	c.commit([]*submission{sub(a, sa, 1, stage(taskrunnerv1.TaskStage_TASK_STAGE_EXPLORE)), sub(a, sa, 2, line()), sub(b, sb, 1, line())})
	require.Contains(t, c.known, a, "the committer remembers the tasks it wrote")
	require.Equal(t, int64(2), c.known[a].seqs.Runner)
	require.Equal(t, task.StageExplore, c.known[a].task.Stage)

	// Remembered and unchanged: the next batch takes the one-round-trip path.
	c.commit([]*submission{sub(a, sa, 3, line())})
	ack, err := sa.state()
	require.NoError(t, err)
	require.Equal(t, int64(3), ack)

	// A is cancelled through the API: its next event is refused.
	_, _, err = tasks.Advance(ctx, a, "", task.Advance{Status: task.StatusCancelled, FailedReason: "stop", RequestID: "cancel"})
	require.NoError(t, err)
	c.commit([]*submission{sub(a, sa, 4, line())})
	_, err = sa.state()
	require.ErrorIs(t, err, errs.ErrInvalidTransition)
	require.Equal(t, int64(3), count(a))
	got, err := tasks.Get(ctx, a, "")
	require.NoError(t, err)
	require.Equal(t, task.StatusCancelled, got.Status, "the cancel must not be overwritten")
	require.NotContains(t, c.known, a)

	// Another replica stored B's seq 2 and 3 and moved its stage: this
	// committer's B is behind. Its resend of 2..4 stores only 4.
	so := newSink()
	other.commit([]*submission{sub(b, so, 2, line()), sub(b, so, 3, stage(taskrunnerv1.TaskStage_TASK_STAGE_PROPOSE))})
	ack, err = so.state()
	require.NoError(t, err)
	require.Equal(t, int64(3), ack)
	c.commit([]*submission{sub(b, sb, 2, line()), sub(b, sb, 3, stage(taskrunnerv1.TaskStage_TASK_STAGE_PROPOSE)), sub(b, sb, 4, stage(taskrunnerv1.TaskStage_TASK_STAGE_APPLY))})
	ack, err = sb.state()
	require.NoError(t, err)
	require.Equal(t, int64(4), ack)
	require.Equal(t, int64(4), count(b))
	got, err = tasks.Get(ctx, b, "")
	require.NoError(t, err)
	require.Equal(t, task.StageApply, got.Stage)
	require.Equal(t, int64(4), got.LastSeq)
	require.Equal(t, int64(4), c.known[b].seqs.Runner)

	// Every pooled connection is still usable after the rolled-back checks.
	var one int
	for range db.Pool.Config().MaxConns {
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT 1`).Scan(&one))
	}
}

func TestConfigValidate(t *testing.T) {
	cases := []struct {
		name string
		cfg  Config
		want string
	}{
		{name: "defaults", cfg: Config{TrustDomain: "t.dev"}},
		{name: "no trust domain", cfg: Config{}, want: "TrustDomain is required"},
		{name: "heartbeat too short", cfg: Config{TrustDomain: "t.dev", HeartbeatInterval: time.Millisecond}, want: "HeartbeatInterval"},
		{name: "batch too big", cfg: Config{TrustDomain: "t.dev", MaxBatch: 20000}, want: "MaxBatch"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if tc.want == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tc.want)
		})
	}
}

func TestCancelChannelRoundTrip(t *testing.T) {
	id, ok := taskFromCancelChannel("p:", CancelChannel("p:", "abc"))
	require.True(t, ok)
	require.Equal(t, "abc", id)
	_, ok = taskFromCancelChannel("p:", eventwire.Channel("p:", "abc"))
	require.False(t, ok)
	require.Equal(t, "p:taskrunner:task:abc:events", eventwire.Channel("p:", "abc"))
}
