package task

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/taskrunner/taskrunner/services/errs"
)

// What Dispatch and its reaper read of the tasks table to decide, and the
// columns only they write (dispatched_at, started_at, deadline_at). The
// SQL lives here, with the table's other statements; the decisions
// (quotas, capacity) stay in package dispatch.

const (
	lockForAdmission = `SELECT owner, repo, status FROM tasks WHERE id = $1 FOR UPDATE`
	// Runs started (first runs and follow-ups) count against the owner's quota.
	ownerWindow = `SELECT count(*), min(r.started_at) FROM task_runs r JOIN tasks t ON t.id = r.task_id
WHERE t.owner = $1 AND r.started_at > now() - interval '24 hours'`
	runningCounts  = `SELECT count(*) FILTER (WHERE repo = $1), count(*) FROM tasks WHERE status = 'running'`
	queuedForRepo  = `SELECT EXISTS (SELECT 1 FROM tasks WHERE status = 'queued' AND repo = $1)`
	markDispatched = `WITH t AS (UPDATE tasks SET dispatched_at = coalesce(dispatched_at, now()) WHERE id = $1 RETURNING id, run)
UPDATE task_runs r SET started_at = coalesce(r.started_at, now()), state = 'running' FROM t WHERE r.task_id = t.id AND r.number = t.run`
	markStarted   = `UPDATE tasks SET started_at = now(), deadline_at = now() + $2 * interval '1 second' WHERE id = $1 RETURNING deadline_at`
	queuedOldest  = `SELECT id::text, repo FROM tasks WHERE status = 'queued' ORDER BY queued_at, id LIMIT $1`
	runningByRepo = `SELECT repo, count(*) FROM tasks WHERE status = 'running' GROUP BY repo`
)

// LockForAdmission locks a task for an admission decision and returns its
// owner, repository and status.
func (tx *Tx) LockForAdmission(ctx context.Context, id string) (owner, repo string, st Status, err error) {
	err = tx.QueryRow(ctx, lockForAdmission, id).Scan(&owner, &repo, &st)
	if errors.Is(err, pgx.ErrNoRows) {
		err = errs.NotFound("task", id)
	}
	return owner, repo, st, err
}

// DispatchedInWindow counts the owner's runs (first runs and follow-ups)
// started in the last 24 hours and returns the oldest start among them.
func (tx *Tx) DispatchedInWindow(ctx context.Context, owner string) (n int, oldest *time.Time, err error) {
	err = tx.QueryRow(ctx, ownerWindow, owner).Scan(&n, &oldest)
	return n, oldest, err
}

// MarkDispatched records that the task was admitted (it counts against the
// owner's quota from now on).
func (tx *Tx) MarkDispatched(ctx context.Context, id string) error {
	_, err := tx.Exec(ctx, markDispatched, id)
	return err
}

// RunningCounts returns how many tasks run in repo and in all.
func (tx *Tx) RunningCounts(ctx context.Context, repo string) (inRepo, global int, err error) {
	err = tx.QueryRow(ctx, runningCounts, repo).Scan(&inRepo, &global)
	return inRepo, global, err
}

// QueuedForRepo reports whether a task of repo is waiting in the queue.
func (tx *Tx) QueuedForRepo(ctx context.Context, repo string) (bool, error) {
	var ok bool
	err := tx.QueryRow(ctx, queuedForRepo, repo).Scan(&ok)
	return ok, err
}

// MarkStarted sets the task's start time and its hard deadline timeout from
// now, and returns the deadline.
func (tx *Tx) MarkStarted(ctx context.Context, id string, timeout time.Duration) (time.Time, error) {
	var deadline time.Time
	err := tx.QueryRow(ctx, markStarted, id, timeout.Seconds()).Scan(&deadline)
	return deadline, err
}

// Queued is a task waiting in the queue.
type Queued struct{ ID, Repo string }

// OldestQueued returns up to limit queued tasks, oldest first.
func (tx *Tx) OldestQueued(ctx context.Context, limit int) ([]Queued, error) {
	rows, err := tx.Query(ctx, queuedOldest, limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Queued, error) {
		var q Queued
		return q, r.Scan(&q.ID, &q.Repo)
	})
}

// RunningByRepo returns the running tasks per repository and their total.
func (tx *Tx) RunningByRepo(ctx context.Context) (map[string]int, int, error) {
	rows, err := tx.Query(ctx, runningByRepo)
	if err != nil {
		return nil, 0, err
	}
	defer rows.Close()
	out, total := map[string]int{}, 0
	for rows.Next() {
		var repo string
		var n int
		if err := rows.Scan(&repo, &n); err != nil {
			return nil, 0, err
		}
		out[repo], total = n, total+n
	}
	return out, total, rows.Err()
}

const (
	pastDeadline = `SELECT id::text FROM tasks WHERE status = 'running' AND deadline_at < now() - $1 * interval '1 second'`
	// A runner is alive while anything arrives from it: a heartbeat, or an
	// event it sent (the newest runner event of the timeline); silence is
	// counted from the latest of those and the current run's start
	// (started_at, set again for each follow-up run: the previous run's
	// heartbeats are older than its runner).
	silentRunners = `SELECT t.id::text FROM tasks t WHERE t.status = 'running'
AND coalesce(greatest(t.heartbeat_at, t.started_at,
	(SELECT e.created_at FROM task_events e WHERE e.task_id = t.id AND e.runner_seq IS NOT NULL ORDER BY e.seq DESC LIMIT 1)),
	t.updated_at) < now() - $1 * interval '1 second'`
	queueDepth    = `SELECT count(*) FROM tasks WHERE status = 'queued'`
	countByStatus = `SELECT status, count(*) FROM tasks GROUP BY status`
	traceparentOf = `SELECT traceparent FROM tasks WHERE id = $1`
	statusesOf    = `SELECT id::text, status, updated_at FROM tasks WHERE id = ANY($1::uuid[])`
	lastRunnerSeq = `SELECT coalesce((SELECT e.runner_seq FROM task_events e JOIN tasks t ON t.id = e.task_id
	WHERE e.task_id = $1 AND e.run = t.run AND e.runner_seq IS NOT NULL ORDER BY e.seq DESC LIMIT 1), 0)`
	deleteUnstared = `DELETE FROM tasks WHERE id = $1 AND status = 'proposing' AND dispatched_at IS NULL`
)

// PastDeadline returns the running tasks whose deadline passed more than
// grace ago.
func (s *Store) PastDeadline(ctx context.Context, grace time.Duration) ([]string, error) {
	return s.ids(ctx, pastDeadline, grace.Seconds())
}

// Silent returns the running tasks from whose runner nothing (heartbeat or
// event) arrived within window.
func (s *Store) Silent(ctx context.Context, window time.Duration) ([]string, error) {
	return s.ids(ctx, silentRunners, window.Seconds())
}

func (s *Store) ids(ctx context.Context, q string, args ...any) ([]string, error) {
	rows, err := s.pool.Query(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// QueueDepth is the number of queued tasks.
func (s *Store) QueueDepth(ctx context.Context) (int64, error) {
	var n int64
	err := s.pool.QueryRow(ctx, queueDepth).Scan(&n)
	return n, err
}

// CountByStatus counts the tasks in each status.
func (s *Store) CountByStatus(ctx context.Context) (map[Status]int64, error) {
	rows, err := s.pool.Query(ctx, countByStatus)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[Status]int64{}
	for rows.Next() {
		var st Status
		var n int64
		if err := rows.Scan(&st, &n); err != nil {
			return nil, err
		}
		out[st] = n
	}
	return out, rows.Err()
}

// Traceparent returns the W3C traceparent of the task's task.create span
// ("" when unknown).
func (s *Store) Traceparent(ctx context.Context, id string) string {
	var tp string
	_ = s.pool.QueryRow(ctx, traceparentOf, id).Scan(&tp)
	return tp
}

// StatusOf is a task's status and when the row last changed.
type StatusOf struct {
	Status  Status
	Changed time.Time
}

// Statuses returns the status of each existing task among ids.
func (s *Store) Statuses(ctx context.Context, ids []string) (map[string]StatusOf, error) {
	rows, err := s.pool.Query(ctx, statusesOf, ids)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]StatusOf{}
	for rows.Next() {
		var id string
		var st StatusOf
		if err := rows.Scan(&id, &st.Status, &st.Changed); err != nil {
			return nil, err
		}
		out[id] = st
	}
	return out, rows.Err()
}

// LastRunnerSeq is the runner seq of the last event the runner of the
// task's current run sent and the server stored (0: none):
// Welcome.last_persisted_seq.
func (s *Store) LastRunnerSeq(ctx context.Context, id string) (int64, error) {
	var n int64
	err := s.pool.QueryRow(ctx, lastRunnerSeq, id).Scan(&n)
	return n, err
}

// DeleteUnstarted removes a task that was created but never admitted, with
// its timeline, so a create whose dispatch was refused stores nothing and
// its idempotency key can be used again. It reports whether it did.
func (s *Store) DeleteUnstarted(ctx context.Context, id string) (bool, error) {
	tag, err := s.pool.Exec(ctx, deleteUnstared, id)
	return err == nil && tag.RowsAffected() == 1, err
}
