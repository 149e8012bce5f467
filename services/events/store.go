package events

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/taskrunner/taskrunner/services/errs"
	"github.com/taskrunner/taskrunner/services/task"
)

// Record is a stored event row. Payload is EncodeEvent's JSON (as normalised
// by jsonb); DecodeEvent turns it into the wire event.
type Record struct {
	TaskID    string
	Seq       int64
	Type      string
	Payload   []byte
	CreatedAt time.Time
}

// Store reads the task_events table. Writes go through package task only.
type Store struct {
	pool *pgxpool.Pool
}

// NewStore returns a Store on pool.
func NewStore(pool *pgxpool.Pool) *Store { return &Store{pool: pool} }

const listAfter = `SELECT task_id::text, seq, type, payload, created_at FROM task_events
WHERE task_id = $1 AND seq > $2 ORDER BY seq LIMIT $3`

// ListAfter returns up to limit events of a task with seq > afterSeq, oldest
// first. The caller checks that taskID is a valid id the caller may read.
func (s *Store) ListAfter(ctx context.Context, taskID string, afterSeq int64, limit int) ([]Record, error) {
	rows, err := s.pool.Query(ctx, listAfter, taskID, afterSeq, limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Record, error) {
		var rec Record
		err := r.Scan(&rec.TaskID, &rec.Seq, &rec.Type, &rec.Payload, &rec.CreatedAt)
		return rec, err
	})
}

// MaxPageBytes bounds the stored payload bytes of one page of ListEvents
// and of one replay read: under gRPC's default 4 MiB message limit with
// room to spare (an event's protobuf form is no larger than its JSON), so
// a page of long log events never fails with ResourceExhausted. A page
// holds at least one event (one event is at most MaxEventBytes).
const MaxPageBytes = 3 << 20

// listPage is listAfter that also stops by size: upto is the running sum
// of the payloads' JSON lengths, and the first row past maxBytes is
// returned too (and always the first two) so that Page can tell a page cut
// by size from the end. The window runs in seq order under the LIMIT, so
// PostgreSQL reads no further than the rows it returns. It reads nothing
// unless the task is owned by $5 (empty: any owner): a one-time filter.
const listPage = `SELECT task_id::text, seq, type, payload, created_at, upto FROM (
	SELECT task_id, seq, type, payload, created_at,
		sum(octet_length(payload::text)) OVER (ORDER BY seq) AS upto,
		octet_length(payload::text) AS size,
		row_number() OVER (ORDER BY seq) AS n
	FROM task_events WHERE task_id = $1 AND seq > $2
		AND EXISTS (SELECT 1 FROM tasks k WHERE k.id = $1 AND ($5 = '' OR k.owner = $5))
	ORDER BY seq LIMIT $3) e
WHERE n <= 2 OR upto - size < $4 ORDER BY seq`

// Page returns the events of a task with seq > afterSeq, oldest first, at
// most limit of them and no more than maxBytes of payload (but at least
// one); more reports that events after the page exist. The caller checks
// that taskID is a valid id the caller may read.
func (s *Store) Page(ctx context.Context, taskID string, afterSeq int64, limit, maxBytes int) (recs []Record, more bool, err error) {
	rows, err := s.pool.Query(ctx, listPage, taskID, afterSeq, limit+1, maxBytes, "")
	if err != nil {
		return nil, false, err
	}
	return scanPage(rows, limit, maxBytes)
}

// OwnedPage is Page for a caller that may read only owner's tasks (owner
// "": any): it reads the task (task.QueueGet) and the page in one round
// trip, and answers NotFound, as task.Store.Get does, when the task is
// missing or another owner's (no event of it is read).
func (s *Store) OwnedPage(ctx context.Context, taskID, owner string, afterSeq int64, limit, maxBytes int) (recs []Record, more bool, err error) {
	var t task.Task
	var found bool
	b := &pgx.Batch{}
	task.QueueGet(b, taskID, owner, &t, &found)
	b.Queue(listPage, taskID, afterSeq, limit+1, maxBytes, owner).Query(func(rows pgx.Rows) error {
		recs, more, err = scanPage(rows, limit, maxBytes)
		return err
	})
	if err := s.pool.SendBatch(ctx, b).Close(); err != nil {
		return nil, false, err
	}
	if !found {
		return nil, false, errs.NotFound("task", taskID)
	}
	return recs, more, nil
}

// scanPage reads listPage's rows (see Page).
func scanPage(rows pgx.Rows, limit, maxBytes int) (recs []Record, more bool, err error) {
	var upto []int64
	recs, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (Record, error) {
		var rec Record
		var u int64
		err := r.Scan(&rec.TaskID, &rec.Seq, &rec.Type, &rec.Payload, &rec.CreatedAt, &u)
		upto = append(upto, u)
		return rec, err
	})
	if err != nil {
		return nil, false, err
	}
	keep := 1
	for keep < len(recs) && upto[keep] <= int64(maxBytes) {
		keep++
	}
	if keep < len(recs) {
		recs, more = recs[:keep], true // the rows past the size limit
	}
	if len(recs) > limit {
		recs, more = recs[:limit], true
	}
	return recs, more, nil
}

// runnerEnded is whether the runner's own terminal event is stored.
const runnerEnded = `SELECT EXISTS (SELECT 1 FROM task_events WHERE task_id = $1 AND runner_seq IS NOT NULL
	AND type IN ('completed', 'failed', 'cancelled'))`

// RunnerEnded reports whether a task's runner sent its terminal event
// (completed, failed or cancelled) and it was stored.
func (s *Store) RunnerEnded(ctx context.Context, taskID string) (bool, error) {
	var ended bool
	err := s.pool.QueryRow(ctx, runnerEnded, taskID).Scan(&ended)
	return ended, err
}
