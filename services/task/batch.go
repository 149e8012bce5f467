package task

import (
	"github.com/jackc/pgx/v5"

	"github.com/taskrunner/taskrunner/services/errs"
)

// The batch API below is for a caller that moves many tasks in one
// transaction and wants few round trips: it locks every task with one
// statement (QueueLock), applies transitions in memory (Step), and writes
// each task's final state with one statement (QueueSave), all queued on
// pgx batches. The Events committer uses it; everything else uses
// Store.Advance or AdvanceTx.

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

// Step is AdvanceTx's decision for a task the caller holds locked: a Seq at
// or below cur.LastSeq is a redelivery (applied = false, nothing changes);
// otherwise Apply's rules hold and next carries the new LastSeq. Steps may
// be chained on the returned task before one QueueSave writes the result.
// It refuses what needs the database: a RequestID, or moving to running
// (which needs the sandbox check).
func Step(cur Task, a Advance) (next Task, applied bool, err error) {
	if a.Seq > 0 && a.Seq <= cur.LastSeq {
		return cur, false, nil
	}
	if a.RequestID != "" || (a.Status == StatusRunning && cur.Status != StatusRunning) {
		return cur, false, errs.Invalid("advance", "request ids and the move to running go through AdvanceTx")
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
