package task_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/taskrunner/taskrunner/platform/eventwire"
	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
	"github.com/taskrunner/taskrunner/services/errs"
	"github.com/taskrunner/taskrunner/services/store/storetest"
	"github.com/taskrunner/taskrunner/services/task"
)

type timelineEnv struct {
	db    *storetest.DB
	rds   *storetest.Redis
	store *task.Store
}

func newTimelineEnv(t *testing.T) *timelineEnv {
	db, rds := storetest.NewDB(t), storetest.NewRedis(t)
	return &timelineEnv{db: db, rds: rds, store: task.NewStore(db.Pool).WithPublisher(task.NewRedisPublisher(rds.Client, rds.Prefix, nil))}
}

// in creates a task and puts it in status st (with what st needs: a
// sandbox row, a pull request), as the earlier steps of its life would.
func (e *timelineEnv) in(t *testing.T, st task.Status) task.Task {
	t.Helper()
	ctx := context.Background()
	tk, _, err := e.store.Create(ctx, task.NewTask{Owner: "alice", Repo: "acme/widgets", BaseBranch: "main", Prompt: "p", Agent: task.AgentClaude}, "")
	require.NoError(t, err)
	_, err = e.db.Pool.Exec(ctx, `INSERT INTO sandboxes (task_id, provider) VALUES ($1, 'process')`, tk.ID)
	require.NoError(t, err)
	path := map[task.Status][]task.Advance{
		task.StatusQueued:         {{Status: task.StatusQueued}},
		task.StatusRunning:        {{Status: task.StatusRunning}},
		task.StatusAwaitingReview: {{Status: task.StatusRunning}, {Status: task.StatusAwaitingReview, PRURL: "http://forge/acme/widgets/pull/1", PRNumber: 1}},
		task.StatusDone:           {{Status: task.StatusRunning}, {Status: task.StatusAwaitingReview, PRURL: "http://forge/acme/widgets/pull/1", PRNumber: 1}, {Status: task.StatusDone}},
		task.StatusFailed:         {{Status: task.StatusFailed, FailedReason: "x"}},
		task.StatusCancelled:      {{Status: task.StatusCancelled, FailedReason: "x"}},
	}[st]
	for i, a := range path {
		a.RequestID = fmt.Sprintf("setup-%d", i)
		tk, _, err = e.store.Advance(ctx, tk.ID, "", a)
		require.NoError(t, err)
	}
	tk, err = e.store.Get(ctx, tk.ID, "")
	require.NoError(t, err)
	require.Equal(t, st, tk.Status)
	return tk
}

type storedEvent struct {
	seq   int64
	typ   string
	event *taskrunnerv1.Event
}

func (e *timelineEnv) events(t *testing.T, id string) []storedEvent {
	t.Helper()
	rows, err := e.db.Pool.Query(context.Background(), `SELECT seq, type, payload FROM task_events WHERE task_id = $1 ORDER BY seq`, id)
	require.NoError(t, err)
	defer rows.Close()
	var out []storedEvent
	for rows.Next() {
		var s storedEvent
		var payload []byte
		require.NoError(t, rows.Scan(&s.seq, &s.typ, &payload))
		ev, err := eventwire.DecodeEvent(payload)
		require.NoError(t, err)
		require.Equal(t, s.seq, ev.GetSeq(), "the stored JSON carries its own seq")
		require.Equal(t, int64(len(out)+1), s.seq, "the timeline is gap-free")
		s.event = ev
		out = append(out, s)
	}
	require.NoError(t, rows.Err())
	return out
}

var actors = []task.Actor{task.UserActor("alice"), task.ActorRunner, task.ActorReaper, task.ActorGitHub, task.ActorDispatch}

// TestEveryTransitionIsOnTheTimeline walks every status move, legal or
// not, from every actor. A legal one changes the row and appends exactly
// one status_change (from, to, reason, actor) at the next seq, which is
// what a subscriber receives over Redis (and so over SSE), marked final
// when the task ends. An illegal one changes nothing.
func TestEveryTransitionIsOnTheTimeline(t *testing.T) {
	e := newTimelineEnv(t)
	ctx := context.Background()
	ps := e.rds.Client.PSubscribe(ctx, eventwire.Channel(e.rds.Prefix, "*"))
	defer ps.Close()
	_, err := ps.Receive(ctx)
	require.NoError(t, err)
	live := ps.Channel()

	for _, from := range task.Statuses {
		for _, to := range task.Statuses {
			if from == to {
				continue
			}
			for _, actor := range actors {
				name := fmt.Sprintf("%s→%s by %s", from, to, actor)
				t.Run(name, func(t *testing.T) {
					tk := e.in(t, from)
					before := e.events(t, tk.ID)
					for len(live) > 0 { // what setting it up published
						<-live
					}
					a := task.Advance{RequestID: "move", Status: to, Actor: actor, Reason: "because " + string(actor)}
					switch to {
					case task.StatusAwaitingReview:
						a.PRURL, a.PRNumber = "http://forge/acme/widgets/pull/2", 2
					case task.StatusFailed, task.StatusCancelled:
						a.FailedReason = "stopped"
					}
					got, applied, err := e.store.Advance(ctx, tk.ID, "", a)
					after := e.events(t, tk.ID)
					row, gerr := e.store.Get(ctx, tk.ID, "")
					require.NoError(t, gerr)
					if !task.CanMove(from, to) {
						require.ErrorIs(t, err, errs.ErrInvalidTransition)
						require.False(t, applied)
						require.Equal(t, from, row.Status, "an illegal move changes nothing")
						require.Equal(t, tk.UpdatedAt, row.UpdatedAt)
						require.Len(t, after, len(before), "an illegal move appends nothing")
						return
					}
					require.NoError(t, err)
					require.True(t, applied)
					require.Equal(t, to, got.Status)
					require.Equal(t, to, row.Status)
					require.Len(t, after, len(before)+1)
					last := after[len(after)-1]
					require.Equal(t, eventwire.TypeStatusChange, last.typ)
					sc := last.event.GetStatusChange()
					require.Equal(t, task.StatusToProto(from), sc.GetFrom())
					require.Equal(t, task.StatusToProto(to), sc.GetTo())
					require.Equal(t, string(actor), sc.GetActor())
					require.Equal(t, "because "+string(actor), sc.GetReason())
					require.Equal(t, last.seq, row.TimelineSeq)

					timeout := time.After(10 * time.Second)
					for seen := false; !seen; {
						select {
						case m := <-live:
							msg, err := eventwire.DecodeMessage([]byte(m.Payload))
							require.NoError(t, err)
							if m.Channel != eventwire.Channel(e.rds.Prefix, tk.ID) || msg.Seq < last.seq {
								continue // setting up this or an earlier case
							}
							require.Equal(t, last.seq, msg.Seq)
							require.Equal(t, eventwire.TypeStatusChange, msg.Type)
							require.Equal(t, to.Terminal(), msg.Final, "the final event of a timeline is marked")
							ev, err := eventwire.DecodeEvent(msg.Payload)
							require.NoError(t, err)
							require.Equal(t, sc.GetTo(), ev.GetStatusChange().GetTo())
							seen = true
						case <-timeout:
							t.Fatal("the status change was not published")
						}
					}

					// Repeating the request changes nothing more.
					_, applied, err = e.store.Advance(ctx, tk.ID, "", a)
					require.NoError(t, err)
					require.False(t, applied)
					require.Len(t, e.events(t, tk.ID), len(after))
				})
			}
		}
	}
}

// TestATransitionAndItsEventCommitTogether breaks the transaction after the
// move, by an error and by killing the database session: neither the row
// change nor the event exists afterwards, and nothing was published.
func TestATransitionAndItsEventCommitTogether(t *testing.T) {
	e := newTimelineEnv(t)
	ctx := context.Background()
	ps := e.rds.Client.PSubscribe(ctx, eventwire.Channel(e.rds.Prefix, "*"))
	defer ps.Close()
	_, err := ps.Receive(ctx)
	require.NoError(t, err)
	for _, kill := range []string{"error", "session killed"} {
		t.Run(kill, func(t *testing.T) {
			tk := e.in(t, task.StatusRunning)
			before := e.events(t, tk.ID)
			for len(ps.Channel()) > 0 {
				<-ps.Channel()
			}
			broken := errors.New("broken mid-way")
			err := e.store.InTx(ctx, func(tx *task.Tx) error {
				if _, _, err := tx.Advance(ctx, tk.ID, "", task.Advance{Status: task.StatusFailed, FailedReason: "x", Actor: task.ActorReaper}); err != nil {
					return err
				}
				if kill == "error" {
					return broken
				}
				_, err := tx.Exec(ctx, `SELECT pg_terminate_backend(pg_backend_pid())`)
				return err
			})
			require.Error(t, err)
			row, err := e.store.Get(ctx, tk.ID, "")
			require.NoError(t, err)
			require.Equal(t, task.StatusRunning, row.Status)
			require.Len(t, e.events(t, tk.ID), len(before))
			quiet := time.After(300 * time.Millisecond)
			for done := false; !done; {
				select {
				case m := <-ps.Channel():
					msg, err := eventwire.DecodeMessage([]byte(m.Payload))
					require.NoError(t, err)
					require.False(t, m.Channel == eventwire.Channel(e.rds.Prefix, tk.ID) && msg.Seq > int64(len(before)),
						"published %q from a transaction that did not commit", m.Payload)
				case <-quiet:
					done = true
				}
			}
		})
	}
}

// TestQueuePositionsFollowTheQueue: a task entering the queue learns its
// place; when the task ahead leaves, those behind hear their new places.
func TestQueuePositionsFollowTheQueue(t *testing.T) {
	e := newTimelineEnv(t)
	ctx := context.Background()
	a, b, c := e.in(t, task.StatusQueued), e.in(t, task.StatusQueued), e.in(t, task.StatusQueued)
	for i, tk := range []task.Task{a, b, c} {
		got, err := e.store.Get(ctx, tk.ID, "")
		require.NoError(t, err)
		require.Equal(t, int64(i+1), got.QueuePosition)
		evs := e.events(t, tk.ID)
		require.Equal(t, int64(i+1), evs[len(evs)-1].event.GetStatusChange().GetQueuePosition())
	}
	_, _, err := e.store.Advance(ctx, a.ID, "", task.Advance{Status: task.StatusCancelled, FailedReason: "no longer needed", Actor: task.UserActor("alice")})
	require.NoError(t, err)
	for i, tk := range []task.Task{b, c} {
		got, err := e.store.Get(ctx, tk.ID, "")
		require.NoError(t, err)
		require.Equal(t, int64(i+1), got.QueuePosition)
		evs := e.events(t, tk.ID)
		require.Equal(t, int64(i+1), evs[len(evs)-1].event.GetQueuePosition().GetPosition())
	}
	got, err := e.store.Get(ctx, a.ID, "")
	require.NoError(t, err)
	require.Zero(t, got.QueuePosition)
}
