package events

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"

	"github.com/taskrunner/taskrunner/platform/eventwire"
	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
	"github.com/taskrunner/taskrunner/services/errs"
	"github.com/taskrunner/taskrunner/services/store"
	"github.com/taskrunner/taskrunner/services/task"
)

// submission is one thing a runner stream asks the committer to do: persist
// an event (ev != nil) or record a heartbeat (ev == nil).
type submission struct {
	taskID string
	ev     *taskrunnerv1.Event // its seq is the runner's
	typ    string
	body   []byte // eventwire.EncodeBody: the JSON without seq
	sink   *sink
	// late is true for an event the runner sent before its terminal one
	// (none is stored, Connect checked, and none went before it on the
	// stream): if the control plane failed the task meanwhile, it is a
	// late runner's (task.AcceptsLateRunner), still taken.
	late bool
}

// sink collects a stream's results without ever blocking the committer: the
// highest acknowledged seq and the first refusal, plus a one-slot wake-up.
type sink struct {
	mu     sync.Mutex
	ack    int64
	err    error
	notify chan struct{}
}

func newSink() *sink { return &sink{notify: make(chan struct{}, 1)} }

func (s *sink) acked(seq int64) {
	s.mu.Lock()
	if seq > s.ack {
		s.ack = seq
	}
	s.mu.Unlock()
	s.wake()
}

func (s *sink) fail(err error) {
	s.mu.Lock()
	if s.err == nil {
		s.err = err
	}
	s.mu.Unlock()
	s.wake()
}

func (s *sink) wake() {
	select {
	case s.notify <- struct{}{}:
	default:
	}
}

func (s *sink) state() (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ack, s.err
}

// committer batches the submissions of every stream into few transactions
// (group commit), one transaction at a time. A server runs
// Config.Committers of them on one intake (see intake for who takes what),
// sharing one memory of the tasks they wrote (a task is in one committer's
// hands at a time, so whoever writes it next finds it as it was left) and
// one publisher, which sends committed events to Redis in commit order, so a
// slow Redis never delays an acknowledgement.
type committer struct {
	cfg     Config
	pool    *pgxpool.Pool
	log     *slog.Logger
	publish chan []task.Appended // to the publisher, in commit order
	// known is what the committers wrote last (see transact), under
	// knownMu.
	known   map[string]known
	knownMu *sync.Mutex
	// ingested counts events stored (redeliveries excluded).
	ingested metric.Int64Counter
}

// newCommitter is a committer with a memory and a publish queue of its own
// (each one stands for a replica); newCommitters makes a server's.
func newCommitter(cfg Config, pool *pgxpool.Pool, log *slog.Logger) *committer {
	ingested, _ := otel.Meter("github.com/taskrunner/taskrunner/services/events").Int64Counter("taskrunner.events.ingested",
		metric.WithDescription("Runner events stored in PostgreSQL"))
	return &committer{cfg: cfg, pool: pool, log: log, ingested: ingested,
		publish: make(chan []task.Appended, 256), known: map[string]known{}, knownMu: &sync.Mutex{}}
}

// newCommitters makes n committers that share a memory and a publish queue.
func newCommitters(n int, cfg Config, pool *pgxpool.Pool, log *slog.Logger) []*committer {
	first := newCommitter(cfg, pool, log)
	out := []*committer{first}
	for range n - 1 {
		c := newCommitter(cfg, pool, log)
		c.publish, c.known, c.knownMu = first.publish, first.known, first.knownMu
		out = append(out, c)
	}
	return out
}

// run commits, as committer k of in, until ctx ends. Submissions still
// queued then are dropped: they were never acknowledged, so their runners
// resend them after reconnecting.
func (c *committer) run(ctx context.Context, in *intake, k int) {
	buf := make([]*submission, 0, c.cfg.MaxBatch) // reused: commit keeps no reference to a batch
	for {
		batch, held := in.take(ctx, k, c.cfg.MaxBatch, c.cfg.MaxBatchDelay, buf)
		if len(batch) == 0 {
			return
		}
		c.commit(batch) // queues the events to publish before the tasks go back
		in.release(held)
		clear(batch)
		buf = batch
	}
}

// runPublisher publishes committed events in commit order until publish is
// closed. A failed publish is logged: the events are durable and
// subscribers fill gaps from PostgreSQL.
func runPublisher(pub task.Publisher, publish <-chan []task.Appended) {
	for msgs := range publish {
		pub.Publish(context.Background(), msgs)
	}
}

// outcome of a batch for one submission.
type outcome struct {
	ok  bool  // persisted now or before (ack it)
	err error // refused
}

// commit persists a batch and reports to every stream. It uses its own
// context: a batch that started is finished even while the server stops.
func (c *committer) commit(batch []*submission) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var outs map[*submission]outcome
	var pubs []task.Appended
	err := store.Retry(ctx, func() (err error) {
		outs, pubs, err = c.transact(ctx, batch)
		return err
	})
	if err != nil {
		c.log.Error("events: group commit failed", "events", len(batch), "error", err)
		for _, s := range batch {
			s.sink.fail(errs.Unavailable("events could not be stored; reconnect and resend"))
		}
		return
	}
	// One acknowledgement per stream: its highest stored seq in the batch.
	acks := make(map[*sink]int64)
	for _, s := range batch {
		o := outs[s]
		switch {
		case o.err != nil:
			s.sink.fail(o.err)
		case o.ok && s.ev != nil:
			acks[s.sink] = max(acks[s.sink], s.ev.GetSeq())
		}
	}
	for sk, seq := range acks {
		sk.acked(seq)
	}
	if len(pubs) > 0 {
		c.ingested.Add(ctx, int64(len(pubs)))
		c.publish <- pubs
	}
}

// acceptsEvents reports whether a task in status st may still receive runner
// events: not after its terminal event (awaiting_review follows completed).
func acceptsEvents(st task.Status) bool {
	return st == task.StatusProposing || st == task.StatusQueued || st == task.StatusRunning
}

// known is what a committer wrote last for a task: its row and where its
// timeline stood. The committer holding the task (intake) reads and
// replaces it, under knownMu.
type known struct {
	task task.Task
	seqs task.Seqs
}

// maxKnown bounds the committer's memory of tasks; past it, it forgets them
// all and reads the next batches afresh.
const maxKnown = 4096

// grouped is a batch by task: the task ids in id order (the locking
// order), each task's events in arrival order, and the tasks that sent a
// heartbeat.
type grouped struct {
	batch  []*submission
	ids    []string
	byTask map[string][]*submission
	beats  []string
}

func groupBatch(batch []*submission) grouped {
	g := grouped{batch: batch, byTask: map[string][]*submission{}}
	for _, s := range batch {
		if _, seen := g.byTask[s.taskID]; !seen {
			g.ids = append(g.ids, s.taskID)
			g.byTask[s.taskID] = nil
		}
		if s.ev == nil {
			g.beats = append(g.beats, s.taskID)
			continue
		}
		g.byTask[s.taskID] = append(g.byTask[s.taskID], s)
	}
	slices.Sort(g.ids)
	return g
}

// transact writes one batch in one transaction. Events are checked per task
// in arrival order and transitions applied in memory (decide), so nothing
// the state machine refuses reaches the database and a refusal never costs
// the rest of the batch a retry.
//
// When the committer wrote every task of the batch itself last time, it
// decides from what it remembers and needs one round trip: BEGIN,
// task.QueueExpect (which locks the tasks and aborts the transaction if any
// changed since: the invariant is written down in package task), the
// writes, COMMIT. A stale memory costs a ROLLBACK and the slow path. The
// slow path takes two: BEGIN with the locks (task.QueueLock) and each
// timeline's task.Seqs, then the writes and COMMIT.
//
// A failed round trip leaves the connection inside a transaction, and the
// pool destroys such a connection when it is released: nothing half-done
// is ever committed.
func (c *committer) transact(ctx context.Context, batch []*submission) (map[*submission]outcome, []task.Appended, error) {
	conn, err := c.pool.Acquire(ctx)
	if err != nil {
		return nil, nil, err
	}
	defer conn.Release()

	g := groupBatch(batch)
	ids := g.ids
	tasks := make(map[string]task.Task, len(ids))
	seqs := make(map[string]task.Seqs, len(ids))
	fast := true
	c.knownMu.Lock()
	for _, id := range ids {
		k, ok := c.known[id]
		if !ok {
			fast = false
			break
		}
		tasks[id], seqs[id] = k.task, k.seqs
	}
	c.knownMu.Unlock()
	if fast {
		outs, pubs, err := c.write(ctx, conn, g, tasks, seqs, true)
		if err == nil || !task.IsStale(err) {
			if err != nil {
				c.forget(ids)
			}
			return outs, pubs, err
		}
		// Someone else moved a task: forget, roll back, read afresh.
		c.forget(ids)
		if _, err := conn.Exec(ctx, "ROLLBACK"); err != nil {
			return nil, nil, err
		}
		clear(tasks)
		clear(seqs)
	}

	read := &pgx.Batch{}
	read.Queue("BEGIN ISOLATION LEVEL READ COMMITTED")
	task.QueueLock(read, ids, tasks)
	task.QueueLastSeqs(read, ids, seqs)
	if err := conn.SendBatch(ctx, read).Close(); err != nil {
		c.forget(ids)
		return nil, nil, err
	}
	outs, pubs, err := c.write(ctx, conn, g, tasks, seqs, false)
	if err != nil {
		c.forget(ids)
	}
	return outs, pubs, err
}

// forget drops what is remembered of ids: a batch that failed may or may
// not have been committed, and a stale task must be read afresh. (Only the
// batch's tasks: the others' memories are untouched by it.)
func (c *committer) forget(ids []string) {
	c.knownMu.Lock()
	for _, id := range ids {
		delete(c.known, id)
	}
	c.knownMu.Unlock()
}

// write decides the batch (decide) and sends the writes and the COMMIT in
// one round trip; begin also opens the transaction with the fast path's
// check. After a commit it remembers each task's new state.
func (c *committer) write(ctx context.Context, conn *pgxpool.Conn, g grouped, tasks map[string]task.Task, seqs map[string]task.Seqs, begin bool) (map[*submission]outcome, []task.Appended, error) {
	d := decide(g, tasks, seqs)
	var saved []task.Task
	write := &pgx.Batch{}
	if begin {
		write.Queue("BEGIN ISOLATION LEVEL READ COMMITTED")
		task.QueueExpect(write, g.ids, tasks, seqs)
	}
	for _, t := range d.saves {
		task.QueueSave(write, t, func(n task.Task) { saved = append(saved, n) })
	}
	task.QueueAppend(write, d.rows)
	task.QueueHeartbeat(write, g.beats)
	write.Queue("COMMIT").Exec(func(tag pgconn.CommandTag) error {
		if tag.String() != "COMMIT" {
			return errors.New("events: the transaction was rolled back instead of committed")
		}
		return nil
	})
	if err := conn.SendBatch(ctx, write).Close(); err != nil {
		return nil, nil, err
	}

	// Remember what was written: the saved rows carry the database's
	// updated_at, the others are as they were read or remembered.
	for _, n := range saved {
		k := d.finals[n.ID]
		k.task = n
		d.finals[n.ID] = k
	}
	c.knownMu.Lock()
	if len(c.known)+len(d.finals) > maxKnown {
		clear(c.known)
	}
	for id, k := range d.finals {
		if acceptsEvents(k.task.Status) {
			c.known[id] = k
		} else {
			delete(c.known, id) // finished: no more events to write
		}
	}
	c.knownMu.Unlock()
	return d.outs, d.pubs, nil
}

// decision is what one batch does.
type decision struct {
	outs   map[*submission]outcome // every submission's answer
	rows   []task.Row              // events to append, runner's and status changes
	pubs   []task.Appended         // the same, to publish after the commit
	saves  []task.Task             // task rows to write
	finals map[string]known        // each existing task's state after the batch
}

// decide is the committer's rule, without I/O: given each task's row and
// where its timeline stands, it checks every event of the batch per task in
// arrival order — a runner seq at or below the last stored one is a
// redelivery (acknowledged, skipped), a gap or an event after the runner's
// terminal one is refused — gives each accepted event the timeline's next
// seq, applies its transition (task.Step), and appends the status_change of
// every status the runner's events change.
func decide(g grouped, tasks map[string]task.Task, seqs map[string]task.Seqs) decision {
	d := decision{outs: make(map[*submission]outcome, len(g.batch)), finals: make(map[string]known, len(g.ids))}
	for _, s := range g.batch {
		if s.ev == nil {
			d.outs[s] = outcome{ok: true} // a heartbeat
		}
	}
	for _, id := range g.ids {
		t, exists := tasks[id]
		sq := seqs[id]
		ended, changed := false, false
		for _, s := range g.byTask[id] {
			seq := s.ev.GetSeq()
			switch {
			case !exists:
				d.outs[s] = outcome{err: errs.Transition("task %s does not exist", id)}
				continue
			case seq <= sq.Runner:
				d.outs[s] = outcome{ok: true} // redelivery: already stored
				continue
			case seq != sq.Runner+1:
				d.outs[s] = outcome{err: errs.Transition("event seq %d of task %s does not follow the last persisted seq %d: events must be sent in order, without gaps", seq, id, sq.Runner)}
				continue
			case ended || !acceptsEvents(t.Status) && !(s.late && task.AcceptsLateRunner(t)):
				d.outs[s] = outcome{err: errs.Transition("task %s is %s: no event is accepted after its terminal event (got seq %d)", id, terminalStatus(t.Status, ended), seq)}
				continue
			}
			a, has, err := advanceFor(s.ev)
			if err != nil {
				d.outs[s] = outcome{err: err}
				continue
			}
			from := t.Status
			switch {
			case !acceptsEvents(t.Status):
				// A late runner (task.AcceptsLateRunner): the control
				// plane failed the task while the runner worked on. Its
				// events join the timeline after the final status change,
				// and the pull request it salvaged is recorded; the status
				// stays as decided.
				if a.PRURL != "" {
					if n, err := task.RecordPR(t, a.PRURL, a.PRNumber, seq); err == nil {
						t, changed = n, true
					}
				}
			case has:
				// A refused transition refuses its event; the task's later
				// events in this batch then have a gap and are refused too.
				n, applied, err := task.Step(t, a)
				if err != nil {
					d.outs[s] = outcome{err: err}
					continue
				}
				if applied {
					t, changed = n, true
				}
			}
			sq.Runner = seq
			sq.Stored++
			ended = eventwire.RunnerTerminal(s.ev)
			d.outs[s] = outcome{ok: true}
			msg, payload := eventwire.EncodeMessageBody(sq.Stored, t.Run, s.typ, false, s.body)
			d.add(id, t.Run, sq.Stored, seq, s.typ, false, payload, msg)
			if t.Status != from {
				why := a.FailedReason
				if t.Status == task.StatusAwaitingReview {
					why = "pull request opened: " + t.PRURL
				}
				sc := task.StatusChangeEvent(from, t.Status, why, task.ActorRunner, 0)
				sc.Seq = sq.Stored + 1
				sc.GetStatusChange().Run = max(t.Run, 1)
				body, err := eventwire.EncodeEvent(sc)
				if err != nil {
					continue // cannot happen: a well-formed message
				}
				sq.Stored++
				d.add(id, t.Run, sq.Stored, 0, eventwire.TypeStatusChange, eventwire.Final(sc), body, nil)
			}
		}
		if !exists {
			continue
		}
		d.finals[id] = known{task: t, seqs: sq}
		if changed {
			d.saves = append(d.saves, t)
		}
	}
	return d
}

// add appends one event to write and publish; msg, when not nil, is its
// Redis message with payload as its tail (eventwire.EncodeMessageBody).
func (d *decision) add(id string, run int32, seq, runnerSeq int64, typ string, final bool, payload, msg []byte) {
	d.rows = append(d.rows, task.Row{TaskID: id, Seq: seq, RunnerSeq: runnerSeq, Run: run, Type: typ, Payload: payload})
	d.pubs = append(d.pubs, task.Appended{TaskID: id, Seq: seq, Type: typ, Final: final, Payload: payload, Msg: msg})
}

func terminalStatus(st task.Status, ended bool) string {
	if ended {
		return "finishing"
	}
	return string(st)
}

// advanceFor is the task transition an event asks for, if any.
func advanceFor(e *taskrunnerv1.Event) (task.Advance, bool, error) {
	a := task.Advance{Seq: e.GetSeq()}
	switch p := e.GetPayload().(type) {
	case *taskrunnerv1.Event_StageChange:
		st, ok := task.StageFromProto(p.StageChange.GetStage())
		if !ok || st == task.StageNone {
			return a, false, errs.Invalid("stage_change.stage", "unknown stage %d", p.StageChange.GetStage())
		}
		a.Stage = st
	case *taskrunnerv1.Event_DiffStats:
		d := p.DiffStats
		a.Diff = &task.DiffStats{Additions: d.GetAdditions(), Deletions: d.GetDeletions(), FilesChanged: d.GetFilesChanged()}
	case *taskrunnerv1.Event_Usage:
		u := p.Usage
		a.Usage = &task.Usage{CostUSD: u.GetCostUsd(), TokensIn: u.GetTokensIn(), TokensOut: u.GetTokensOut()}
	case *taskrunnerv1.Event_Completed:
		a.Status, a.PRURL, a.PRNumber = task.StatusAwaitingReview, p.Completed.GetPrUrl(), p.Completed.GetPrNumber()
	case *taskrunnerv1.Event_Failed:
		a.Status, a.PRURL, a.PRNumber = task.StatusFailed, p.Failed.GetPrUrl(), p.Failed.GetPrNumber()
		a.FailedReason = p.Failed.GetReason()
		if a.FailedReason == "" {
			a.FailedReason = "runner reported a failure without a reason"
		}
	case *taskrunnerv1.Event_Cancelled:
		a.Status, a.FailedReason = task.StatusCancelled, p.Cancelled.GetReason()
	default:
		return a, false, nil
	}
	return a, true, nil
}
