package events

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
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
