package task

import (
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/taskrunner/taskrunner/services/errs"
)

// The batch API below is for a writer that moves many tasks and appends
// many events in one transaction with few round trips (the Events
// committer): it locks every task with one statement (QueueLock) and reads
// where each timeline stands (QueueLastSeqs), applies transitions in memory
// (Step), and queues the writes (QueueSave, QueueAppend, QueueHeartbeat) on
// pgx batches. Everything else uses Store.Advance or Tx.Advance.
//
// The fast path and its invariant. A writer may skip the locking read and
// decide from what it remembers of a task (its row as last written and its
// Seqs) only if it opens the transaction with QueueExpect. QueueExpect locks
// the tasks in id order and aborts the transaction with SQLSTATE TR001
// (IsStale) unless, for every task, updated_at, status and stage are as
// remembered and the timeline's last seq is the remembered Seqs.Stored. That
// holds exactly when nobody else wrote the task or its timeline since: every
// row change sets updated_at, and every event (the control plane's
// included) takes the next seq. So a remembered Seqs.Runner is also still
// right, and the writer's decisions equal those of the slow path.

const lockTasks = `SELECT ` + taskColumns + ` FROM tasks WHERE id = ANY($1::uuid[]) ORDER BY id FOR UPDATE`

// QueueLock queues a statement that locks the tasks ids, in id order (the
// order every multi-task lock here takes, so two of them cannot deadlock),
// and stores each row found in into when the batch results are read. A
// missing id is simply absent from into.
func QueueLock(b *pgx.Batch, ids []string, into map[string]Task) {
	b.Queue(lockTasks, ids).Query(func(rows pgx.Rows) error {
		for rows.Next() {
			t, err := scanTask(rows)
			if err != nil {
				return err
			}
			into[t.ID] = t
		}
		return rows.Err()
	})
}

// Seqs is where a task's timeline stands: the seq of its last event, and
// the runner seq of the last event the runner of its current run sent (0:
// none yet; runner seqs start again at 1 in every run).
type Seqs struct {
	Stored, Runner int64
}

// lastSeqs reads, after the locks and in a statement of its own (so under
// READ COMMITTED it sees every event committed by whoever held a lock
// before), one index probe per task backwards along the primary key.
const lastSeqs = `SELECT t.id::text,
	coalesce((SELECT e.seq FROM task_events e WHERE e.task_id = t.id ORDER BY e.seq DESC LIMIT 1), 0),
	coalesce((SELECT e.runner_seq FROM task_events e WHERE e.task_id = t.id AND e.run = k.run AND e.runner_seq IS NOT NULL ORDER BY e.seq DESC LIMIT 1), 0)
FROM unnest($1::uuid[]) AS t(id) JOIN tasks k ON k.id = t.id`

// QueueLastSeqs queues the read of every task's Seqs into into.
func QueueLastSeqs(b *pgx.Batch, ids []string, into map[string]Seqs) {
	b.Queue(lastSeqs, ids).Query(func(rows pgx.Rows) error {
		for rows.Next() {
			var id string
			var s Seqs
			if err := rows.Scan(&id, &s.Stored, &s.Runner); err != nil {
				return err
			}
			into[id] = s
		}
		return rows.Err()
	})
}

const expectTasks = `SELECT taskrunner_events_expect($1::uuid[], $2::timestamptz[], $3::text[], $4::text[], $5::bigint[])`

// QueueExpect queues the fast path's check (see above) for ids, whose rows
// and timelines the writer remembers as tasks and seqs.
func QueueExpect(b *pgx.Batch, ids []string, tasks map[string]Task, seqs map[string]Seqs) {
	stamps, statuses, stages, last := make([]time.Time, len(ids)), make([]string, len(ids)), make([]string, len(ids)), make([]int64, len(ids))
	for i, id := range ids {
		t := tasks[id]
		stamps[i], statuses[i], stages[i], last[i] = t.UpdatedAt, string(t.Status), string(t.Stage), seqs[id].Stored
	}
	b.Queue(expectTasks, ids, stamps, statuses, stages, last)
}

// IsStale reports whether err is QueueExpect's refusal.
func IsStale(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "TR001"
}

// Row is one event to append with QueueAppend: Seq is its place on the
// timeline, RunnerSeq the runner's seq (0 for the control plane's events),
// Payload eventwire JSON with seq.
type Row struct {
	TaskID    string
	Seq       int64
	RunnerSeq int64
	Run       int32
	Type      string
	Payload   []byte
}

const insertEvents = `INSERT INTO task_events (task_id, seq, runner_seq, run, type, payload)
SELECT t::uuid, s, nullif(r, 0), greatest(n, 1), ty, p::jsonb FROM unnest($1::text[], $2::bigint[], $3::bigint[], $4::int[], $5::text[], $6::text[]) AS u(t, s, r, n, ty, p)`

// QueueAppend queues the insert of rows, each at the seq the writer chose
// under the task's lock (a conflict aborts the transaction: the writer's
// view was wrong).
func QueueAppend(b *pgx.Batch, rows []Row) {
	if len(rows) == 0 {
		return
	}
	// Payloads go as they are: a []byte encodes as text without a copy, and
	// FlatArray is pgx's array path without reflection.
	ids, seqs, rseqs, runs, types, payloads := make([]string, len(rows)), make([]int64, len(rows)), make([]int64, len(rows)), make([]int32, len(rows)), make([]string, len(rows)), make(pgtype.FlatArray[[]byte], len(rows))
	for i, r := range rows {
		ids[i], seqs[i], rseqs[i], runs[i], types[i], payloads[i] = r.TaskID, r.Seq, r.RunnerSeq, r.Run, r.Type, r.Payload
	}
	b.Queue(insertEvents, ids, seqs, rseqs, runs, types, payloads)
}

const touchHeartbeat = `UPDATE tasks SET heartbeat_at = now() WHERE id = ANY($1::uuid[]) AND status = 'running'`

// QueueHeartbeat queues the heartbeat of the running tasks among ids. It
// does not change updated_at, so it never makes a remembered task stale.
func QueueHeartbeat(b *pgx.Batch, ids []string) {
	if len(ids) > 0 {
		b.Queue(touchHeartbeat, ids)
	}
}

// Step is Tx.Advance's decision for a task the caller holds locked: a Seq
// at or below cur.LastSeq is a redelivery (applied = false, nothing
// changes); otherwise Apply's rules hold and next carries the new LastSeq.
// Steps may be chained on the returned task before one QueueSave writes the
// result. It refuses what needs the database: a RequestID, or moving to
// running (which needs the sandbox check). A status change it makes needs
// its StatusChangeEvent appended by the caller.
func Step(cur Task, a Advance) (next Task, applied bool, err error) {
	if a.Seq > 0 && a.Seq <= cur.LastSeq {
		return cur, false, nil
	}
	if a.RequestID != "" || (a.Status == StatusRunning && cur.Status != StatusRunning) {
		return cur, false, errs.Invalid("advance", "request ids and the move to running go through Tx.Advance")
	}
	n, err := Apply(cur, a, false)
	if err != nil {
		return cur, false, err
	}
	n.LastSeq = max(cur.LastSeq, a.Seq)
	return n, true, nil
}

// QueueSave queues the update that writes t's state as Step left it.
// saved, if not nil, receives the row as written (updated_at is the
// database's) when the results are read.
func QueueSave(b *pgx.Batch, t Task, saved func(Task)) {
	q := b.Queue(updateAdvance, saveArgs(t, t.LastSeq, false)...)
	if saved == nil {
		return
	}
	q.QueryRow(func(row pgx.Row) error {
		n, err := scanTask(row)
		if err != nil {
			return err
		}
		saved(n)
		return nil
	})
}

// saveArgs are updateAdvance's parameters for task state n.
func saveArgs(n Task, seq int64, heartbeat bool) []any {
	return []any{n.ID, n.Status, n.Stage, n.Diff.Additions, n.Diff.Deletions, n.Diff.FilesChanged,
		n.PRURL, n.PRNumber, n.FailedReason, n.Usage.CostUSD, n.Usage.TokensIn, n.Usage.TokensOut, seq, heartbeat}
}
