package task

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/taskrunner/taskrunner/platform/eventwire"
	"github.com/taskrunner/taskrunner/services/errs"
)

// Follow-ups. A task has runs: run 1 is the first; each follow-up adds a
// run that works on the same branch and pull request in a new sandbox. A
// follow-up is recorded as a pending run; Dispatch starts the oldest
// pending run once no run is active (StartRun), so a follow-up sent while
// a run is active waits behind it.

// DefaultMaxRuns bounds the runs of a task (the first included).
const DefaultMaxRuns = 5

// FollowUp is a request for a new run.
type FollowUp struct {
	Prompt, RequestID string
	Trigger           string // api, review, comment
	RequestedBy       string // user:<owner>, github:<login>
}

// CanFollowUp reports whether a task in t's state may get a follow-up
// now or after its active run: it has a pull request to revise and is not
// done or cancelled.
func CanFollowUp(t Task) error {
	switch {
	case t.Status == StatusAwaitingReview:
		return nil
	case t.Status == StatusFailed && t.PRURL != "":
		return nil
	case (t.Status == StatusRunning || t.Status == StatusQueued) && t.Run > 1:
		return nil // a follow-up run is active: the next waits behind it
	case t.Status == StatusRunning || t.Status == StatusQueued || t.Status == StatusProposing:
		return errs.Transition("task %s is %s and has no pull request yet: follow up once it awaits review", t.ID, t.Status)
	case t.Status == StatusFailed:
		return errs.Transition("task %s failed without a pull request: retry it instead", t.ID)
	}
	return errs.Transition("task %s is %s: a follow-up needs a task awaiting review (or failed with a pull request)", t.ID, t.Status)
}

const (
	runByRequest = `SELECT number FROM task_runs WHERE task_id = $1 AND request_id = $2`
	runCount     = `SELECT coalesce(max(number), 0) FROM task_runs WHERE task_id = $1`
	insertRun    = `INSERT INTO task_runs (task_id, number, trigger, prompt, requested_by, request_id) VALUES ($1, $2, $3, $4, $5, nullif($6, ''))`
	nextPending  = `SELECT number, trigger, prompt, requested_by FROM task_runs WHERE task_id = $1 AND number > $2 AND started_at IS NULL ORDER BY number LIMIT 1`
	// A run's usage and diff stats start at zero: the task row holds the
	// current run's (what its runner or the model proxy reports), the
	// timeline every run's (Runs adds them up).
	startRun = `UPDATE tasks SET run = $2, status = $3, stage = '', last_seq = 0, failed_reason = '',
	cost_usd = 0, tokens_in = 0, tokens_out = 0, additions = 0, deletions = 0, files_changed = 0,
	queued_at = CASE WHEN $3 = 'queued' THEN now() ELSE queued_at END, updated_at = now()
WHERE id = $1 RETURNING ` + taskColumns
	markRunStarted = `UPDATE task_runs SET started_at = now(), state = 'running' WHERE task_id = $1 AND number = $2`
	pendingTasks   = `SELECT DISTINCT r.task_id::text FROM task_runs r JOIN tasks t ON t.id = r.task_id
WHERE r.started_at IS NULL AND r.number > t.run AND t.status IN ('awaiting_review', 'failed') LIMIT $1`
)

// AddFollowUp records a follow-up as a pending run of the caller's task
// (owner "" for internal callers). A request id already used returns its
// run with created = false. It refuses a task that cannot be followed up
// and a task that has maxRuns runs.
func (s *Store) AddFollowUp(ctx context.Context, id, owner string, f FollowUp, maxRuns int) (t Task, number int32, created bool, err error) {
	err = s.InTx(ctx, func(tx *Tx) error {
		created = false
		cur, err := scanTask(tx.QueryRow(ctx, lockTask, id, owner))
		if errors.Is(err, pgx.ErrNoRows) {
			return errs.NotFound("task", id)
		}
		if err != nil {
			return err
		}
		t = cur
		if f.RequestID != "" {
			err := tx.QueryRow(ctx, runByRequest, id, f.RequestID).Scan(&number)
			if err == nil {
				return nil
			}
			if !errors.Is(err, pgx.ErrNoRows) {
				return err
			}
		}
		if err := CanFollowUp(cur); err != nil {
			return err
		}
		var n int32
		if err := tx.QueryRow(ctx, runCount, id).Scan(&n); err != nil {
			return err
		}
		if int(n) >= maxRuns {
			return errs.Transition("task %s has %d runs, the most a task may have", id, n)
		}
		number = n + 1
		if _, err := tx.Exec(ctx, insertRun, id, number, f.Trigger, f.Prompt, f.RequestedBy, f.RequestID); err != nil {
			var pgErr *pgconn.PgError
			if errors.As(err, &pgErr) && pgErr.Code == "23505" {
				return errs.Conflict("follow-up %q is being recorded concurrently; retry", f.RequestID)
			}
			return err
		}
		created = true
		return nil
	})
	return t, number, created, err
}

// PendingRun is a follow-up waiting to start.
type PendingRun struct {
	Number      int32
	Trigger     string
	Prompt      string
	RequestedBy string
}

// NextPendingRun returns the oldest run of the locked task t that has not
// started (ok = false when none).
func (tx *Tx) NextPendingRun(ctx context.Context, t Task) (PendingRun, bool, error) {
	var p PendingRun
	err := tx.QueryRow(ctx, nextPending, t.ID, t.Run).Scan(&p.Number, &p.Trigger, &p.Prompt, &p.RequestedBy)
	if errors.Is(err, pgx.ErrNoRows) {
		return p, false, nil
	}
	return p, err == nil, err
}

// StartRun makes run p the task's current run, in status to (running, or
// queued when capacity is short), and appends the status change. The task
// must be locked by tx and idle (awaiting review, or failed with a pull
// request).
func (tx *Tx) StartRun(ctx context.Context, cur Task, p PendingRun, to Status) (Task, error) {
	if err := CanFollowUp(cur); err != nil || cur.Status == StatusRunning || cur.Status == StatusQueued {
		return cur, errs.Transition("task %s is %s: run %d cannot start now", cur.ID, cur.Status, p.Number)
	}
	if to != StatusRunning && to != StatusQueued {
		return cur, errs.Invalid("status", "a run starts running or queued, not %s", to)
	}
	out, err := scanTask(tx.QueryRow(ctx, startRun, cur.ID, p.Number, to))
	if err != nil {
		return cur, err
	}
	if _, err := tx.Exec(ctx, markRunStarted, cur.ID, p.Number); err != nil {
		return cur, err
	}
	why := fmt.Sprintf("follow-up run %d (%s)", p.Number, p.Trigger)
	actor := Actor(p.RequestedBy)
	if actor == "" {
		actor = ActorDispatch
	}
	var pos int64
	if to == StatusQueued {
		if err := tx.QueryRow(ctx, queuePosition, out.ID).Scan(&pos); err != nil {
			return cur, err
		}
	}
	ev := StatusChangeEvent(cur.Status, to, why, actor, pos)
	ev.GetStatusChange().Run = p.Number
	if err := tx.Append(ctx, cur.ID, ev); err != nil {
		return cur, err
	}
	return out, nil
}

// TasksWithPendingRuns returns idle tasks (awaiting review or failed) with
// a follow-up waiting to start.
func (s *Store) TasksWithPendingRuns(ctx context.Context, limit int) ([]string, error) {
	return s.ids(ctx, pendingTasks, limit)
}

const runsOf = `SELECT r.number, r.trigger, r.prompt, r.requested_by, r.created_at, r.started_at IS NOT NULL,
	coalesce((SELECT e.payload FROM task_events e WHERE e.task_id = r.task_id AND e.run = r.number AND e.type = 'diff_stats' ORDER BY e.seq DESC LIMIT 1), '{}'),
	coalesce((SELECT e.payload FROM task_events e WHERE e.task_id = r.task_id AND e.run = r.number AND e.type = 'usage' ORDER BY e.seq DESC LIMIT 1), '{}')
FROM task_runs r WHERE r.task_id = $1 ORDER BY r.number`

// Runs returns t's runs, oldest first, each with the diff stats and usage
// its runner last reported, and sets t.Usage to the total of all runs.
func (s *Store) Runs(ctx context.Context, t *Task) error {
	rows, err := s.pool.Query(ctx, runsOf, t.ID)
	if err != nil {
		return err
	}
	defer rows.Close()
	return scanRuns(rows, t)
}

// scanRuns reads runsOf's rows into t.Runs (see Runs).
func scanRuns(rows pgx.Rows, t *Task) error {
	t.Runs = nil
	var total Usage
	for rows.Next() {
		var r Run
		var started bool
		var diff, usage []byte
		if err := rows.Scan(&r.Number, &r.Trigger, &r.Prompt, &r.RequestedBy, &r.CreatedAt, &started, &diff, &usage); err != nil {
			return err
		}
		r.Diff, r.Usage = decodeDiff(diff), decodeUsage(usage)
		switch {
		case !started && r.Number >= t.Run && !(r.Number == t.Run && t.Status != StatusProposing && t.Status != StatusQueued):
			r.State = "pending"
		case r.Number < t.Run:
			r.State = "finished"
		case t.Status == StatusFailed || t.Status == StatusCancelled:
			r.State = "failed"
		case t.Status == StatusAwaitingReview || t.Status == StatusDone:
			r.State = "finished"
		default:
			r.State = "running"
		}
		if r.Number < t.Run || (r.Number == t.Run && r.State != "pending") {
			total.CostUSD += r.Usage.CostUSD
			total.TokensIn += r.Usage.TokensIn
			total.TokensOut += r.Usage.TokensOut
		}
		t.Runs = append(t.Runs, r)
	}
	if err := rows.Err(); err != nil {
		return err
	}
	if t.Run > 1 {
		t.Usage = total
	}
	return nil
}

func decodeDiff(b []byte) DiffStats {
	e, err := eventwire.DecodeEvent(b)
	if err != nil {
		return DiffStats{}
	}
	d := e.GetDiffStats()
	return DiffStats{Additions: d.GetAdditions(), Deletions: d.GetDeletions(), FilesChanged: d.GetFilesChanged()}
}

func decodeUsage(b []byte) Usage {
	e, err := eventwire.DecodeEvent(b)
	if err != nil {
		return Usage{}
	}
	u := e.GetUsage()
	return Usage{CostUSD: u.GetCostUsd(), TokensIn: u.GetTokensIn(), TokensOut: u.GetTokensOut()}
}

const dropPending = `DELETE FROM task_runs WHERE task_id = $1 AND number = $2 AND started_at IS NULL`

// DropPendingRun forgets a follow-up that never started (its dispatch was
// refused by the owner's quota): nothing of it is kept, and its request id
// may be used again.
func (s *Store) DropPendingRun(ctx context.Context, id string, number int32) error {
	_, err := s.pool.Exec(ctx, dropPending, id, number)
	return err
}

const runPrompt = `SELECT prompt FROM task_runs WHERE task_id = $1 AND number = $2`

// RunPrompt is the follow-up prompt of run number ("" for the first run).
func (s *Store) RunPrompt(ctx context.Context, id string, number int32) string {
	var p string
	_ = s.pool.QueryRow(ctx, runPrompt, id, number).Scan(&p)
	return p
}

// Session is an agent's saved session (see EventsService.SaveSession).
type Session struct {
	Run       int32
	Agent     string
	SessionID string
	Archive   []byte
}

// MaxSessionBytes bounds a saved session archive.
const MaxSessionBytes = 8 << 20

const (
	saveSession = `INSERT INTO task_sessions (task_id, run, agent, session_id, archive) VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (task_id, run) DO UPDATE SET agent = excluded.agent, session_id = excluded.session_id, archive = excluded.archive, created_at = now()`
	loadSession = `SELECT run, agent, session_id, archive FROM task_sessions WHERE task_id = $1 ORDER BY run DESC LIMIT 1`
)

// SaveSession stores the session a run's agent left (one per run; a
// resend replaces it).
func (s *Store) SaveSession(ctx context.Context, id string, ss Session) error {
	if len(ss.Archive) > MaxSessionBytes {
		return errs.Invalid("archive", "is %d bytes, more than the limit of %d", len(ss.Archive), MaxSessionBytes)
	}
	_, err := s.pool.Exec(ctx, saveSession, id, max(ss.Run, 1), ss.Agent, ss.SessionID, ss.Archive)
	return err
}

// LoadSession returns the newest saved session of the task (ok = false
// when there is none).
func (s *Store) LoadSession(ctx context.Context, id string) (Session, bool, error) {
	var ss Session
	err := s.pool.QueryRow(ctx, loadSession, id).Scan(&ss.Run, &ss.Agent, &ss.SessionID, &ss.Archive)
	if errors.Is(err, pgx.ErrNoRows) {
		return ss, false, nil
	}
	return ss, err == nil, err
}
