package task

import (
	"errors"

	"context"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/taskrunner/taskrunner/platform/eventwire"
	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
	"github.com/taskrunner/taskrunner/services/errs"
	"github.com/taskrunner/taskrunner/services/store"
)

// Actor names who decided a transition: "user:<owner>", or one of the
// constants below.
type Actor string

// Actors other than users.
const (
	ActorRunner   Actor = "runner"   // the task's runner reported it
	ActorReaper   Actor = "reaper"   // deadline passed, runner silent, orphan
	ActorGitHub   Actor = "github"   // a webhook: pull request merged or closed
	ActorDispatch Actor = "dispatch" // admission, the queue, sandbox start
)

// UserActor is the actor of a transition a user asked for.
func UserActor(owner string) Actor { return Actor("user:" + owner) }

// Appended is an event added to a task's timeline in a transaction; it is
// published (Publisher) once the transaction commits.
type Appended struct {
	TaskID  string
	Seq     int64
	Type    string
	Final   bool   // the timeline ends here (eventwire.Final)
	Payload []byte // eventwire JSON, seq included
	// Msg, when a writer made it with the payload
	// (eventwire.EncodeMessageBody), is the Redis message, sent as it is.
	Msg []byte
}

// Message is the Redis message of a (the eventwire form).
func (a Appended) Message() []byte {
	if a.Msg != nil {
		return a.Msg
	}
	return eventwire.EncodeMessage(a.Seq, a.Type, a.Final, a.Payload)
}

// Publisher fans committed events out to subscribers. It must not block
// for long and never fails the caller: subscribers fill any gap from the
// database, where every published event already is.
type Publisher interface {
	Publish(ctx context.Context, evs []Appended)
}

// RedisPublisher publishes on each task's eventwire.Channel.
type RedisPublisher struct {
	rdb    redis.UniversalClient
	prefix string
	log    *slog.Logger
}

// NewRedisPublisher returns a Publisher on rdb with channel prefix prefix.
func NewRedisPublisher(rdb redis.UniversalClient, prefix string, log *slog.Logger) *RedisPublisher {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &RedisPublisher{rdb: rdb, prefix: prefix, log: log}
}

// Publish sends evs in order, in one pipeline, within 5 s.
func (p *RedisPublisher) Publish(ctx context.Context, evs []Appended) {
	if len(evs) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_, err := p.rdb.Pipelined(ctx, func(pl redis.Pipeliner) error {
		var task, channel string // writers append a task's events together
		for _, e := range evs {
			if e.TaskID != task || channel == "" {
				task, channel = e.TaskID, eventwire.Channel(p.prefix, e.TaskID)
			}
			pl.Publish(ctx, channel, e.Message())
		}
		return nil
	})
	if err != nil {
		p.log.Warn("task: publish to redis failed; subscribers will read from the database", "events", len(evs), "error", err)
	}
}

// Tx is a transaction on the tasks table and the timelines. Events
// appended in it are published after it commits, never before.
type Tx struct {
	pgx.Tx
	pending []Appended
}

// InTx runs fn in a READ COMMITTED transaction (retried on serialization
// failures and deadlocks) and publishes what it appended after the commit.
func (s *Store) InTx(ctx context.Context, fn func(*Tx) error) error {
	var pending []Appended
	err := store.WithTx(ctx, s.pool, pgx.ReadCommitted, func(ptx pgx.Tx) error {
		tx := &Tx{Tx: ptx}
		if err := fn(tx); err != nil {
			return err
		}
		pending = tx.pending
		return nil
	})
	if err == nil && s.pub != nil && len(pending) > 0 {
		s.pub.Publish(ctx, pending)
	}
	return err
}

// appendEvent takes the next seq of a task's timeline and stores the event
// there. The caller holds the task's row lock (every writer of a timeline
// does: Tx.Advance, the Events committer), which is what makes max(seq)+1
// safe.
const appendEvent = `INSERT INTO task_events (task_id, seq, run, type, payload)
SELECT $1::uuid, n, (SELECT run FROM tasks WHERE id = $1::uuid), $2, jsonb_set($3::jsonb, '{seq}', to_jsonb(n::text))
FROM (SELECT coalesce(max(seq), 0) + 1 AS n FROM task_events WHERE task_id = $1::uuid) s
RETURNING seq, payload::text`

// Append stores e (its seq is ignored) as the next event of the task's
// timeline. The caller must hold the task's row lock.
func (tx *Tx) Append(ctx context.Context, taskID string, e *taskrunnerv1.Event) error {
	if e.GetTime() == nil {
		e.Time = timestamppb.Now()
	}
	body, err := eventwire.EncodeBody(e)
	if err != nil {
		return err
	}
	a := Appended{TaskID: taskID, Type: eventwire.TypeName(e), Final: eventwire.Final(e)}
	var payload string
	if err := tx.QueryRow(ctx, appendEvent, taskID, a.Type, body).Scan(&a.Seq, &payload); err != nil {
		return err
	}
	a.Payload = []byte(payload)
	tx.pending = append(tx.pending, a)
	return nil
}

// StatusChangeEvent is the timeline event of a status change.
func StatusChangeEvent(from, to Status, reason string, actor Actor, queuePos int64) *taskrunnerv1.Event {
	return &taskrunnerv1.Event{Time: timestamppb.Now(), Payload: &taskrunnerv1.Event_StatusChange{StatusChange: &taskrunnerv1.StatusChange{
		From: statusToProto[from], To: statusToProto[to], Reason: CleanReason(reason), Actor: string(actor), QueuePosition: queuePos,
	}}}
}

func (tx *Tx) appendStatusChange(ctx context.Context, id string, from, to Status, reason string, actor Actor, pos int64) error {
	return tx.Append(ctx, id, StatusChangeEvent(from, to, reason, actor, pos))
}

const (
	queuePosition = `SELECT count(*) FROM tasks q, tasks t WHERE t.id = $1 AND q.status = 'queued' AND (q.queued_at, q.id) <= (t.queued_at, t.id)`
	queuedAhead   = `SELECT count(*) FROM tasks WHERE status = 'queued' AND (queued_at, id) < ($1, $2::uuid)`
	lockBehind    = `SELECT id::text FROM tasks WHERE status = 'queued' AND (queued_at, id) > ($1, $2::uuid)
ORDER BY queued_at, id LIMIT $3 FOR UPDATE`
)

// queueNotices bounds the queue_position events one departure from the
// queue appends: tasks further back hear of their place once they are
// within this distance of the front (GetTask always has it).
const queueNotices = 50

// statusChanged appends the status_change of cur → out, and keeps the queue
// positions on the timelines right: a task entering the queue learns its
// place, and the tasks behind one that leaves it move up.
func (tx *Tx) statusChanged(ctx context.Context, cur, out Task, a Advance) error {
	reason := a.Reason
	if reason == "" {
		reason = a.FailedReason
	}
	actor := a.Actor
	if actor == "" {
		actor = ActorDispatch
	}
	var pos int64
	if out.Status == StatusQueued {
		if err := tx.QueryRow(ctx, queuePosition, out.ID).Scan(&pos); err != nil {
			return err
		}
	}
	sc := StatusChangeEvent(cur.Status, out.Status, reason, actor, pos)
	sc.GetStatusChange().Run = max(out.Run, 1)
	if err := tx.Append(ctx, out.ID, sc); err != nil {
		return err
	}
	if cur.Status != StatusQueued || cur.QueuedAt == nil {
		return nil
	}
	var ahead int64
	if err := tx.QueryRow(ctx, queuedAhead, *cur.QueuedAt, cur.ID).Scan(&ahead); err != nil {
		return err
	}
	rows, err := tx.Query(ctx, lockBehind, *cur.QueuedAt, cur.ID, queueNotices)
	if err != nil {
		return err
	}
	behind, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err
	}
	for i, id := range behind {
		e := &taskrunnerv1.Event{Payload: &taskrunnerv1.Event_QueuePosition{QueuePosition: &taskrunnerv1.QueuePosition{Position: ahead + int64(i) + 1}}}
		if err := tx.Append(ctx, id, e); err != nil {
			return err
		}
	}
	return nil
}

// Lock locks the task's row for the rest of tx (a writer of its timeline
// must hold it) and returns the task.
func (tx *Tx) Lock(ctx context.Context, id string) (Task, error) {
	t, err := scanTask(tx.QueryRow(ctx, lockTask, id, ""))
	if errors.Is(err, pgx.ErrNoRows) {
		return Task{}, errs.NotFound("task", id)
	}
	return t, err
}
