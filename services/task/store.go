package task

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/taskrunner/taskrunner/services/errs"
)

// Store is the tasks table and the task timelines (task_events): the only
// code that writes either (see the package doc and TestOnlyTaskWritesTasks).
type Store struct {
	pool *pgxpool.Pool
	pub  Publisher // nil: events are stored, not published
}

// NewStore returns a Store on pool that publishes nothing; see WithPublisher.
func NewStore(pool *pgxpool.Pool) *Store { return &Store{pool: pool} }

// WithPublisher returns a Store that publishes every event it appends once
// its transaction commits.
func (s *Store) WithPublisher(p Publisher) *Store { return &Store{pool: s.pool, pub: p} }

const taskColumns = `id, owner, repo, base_branch, head_branch, prompt, agent, status, stage,
	additions, deletions, files_changed, pr_url, pr_number, failed_reason, cost_usd, tokens_in, tokens_out,
	deadline_at, last_seq, heartbeat_at, trace_id, traceparent, coalesce(retry_of::text, ''), coalesce(idempotency_key, ''),
	queued_at, run, created_at, updated_at`

// viewColumns follow taskColumns where a task is shown to a client: the
// seq of the newest event on its timeline and its place in the queue.
const viewColumns = `coalesce((SELECT e.seq FROM task_events e WHERE e.task_id = tasks.id ORDER BY e.seq DESC LIMIT 1), 0),
	CASE WHEN tasks.status = 'queued' THEN (SELECT count(*) FROM tasks q WHERE q.status = 'queued'
		AND (q.queued_at, q.id) <= (tasks.queued_at, tasks.id)) ELSE 0 END`

func scanTask(row pgx.Row) (Task, error) {
	var t Task
	err := row.Scan(&t.ID, &t.Owner, &t.Repo, &t.BaseBranch, &t.HeadBranch, &t.Prompt, &t.Agent, &t.Status, &t.Stage,
		&t.Diff.Additions, &t.Diff.Deletions, &t.Diff.FilesChanged, &t.PRURL, &t.PRNumber, &t.FailedReason,
		&t.Usage.CostUSD, &t.Usage.TokensIn, &t.Usage.TokensOut,
		&t.DeadlineAt, &t.LastSeq, &t.HeartbeatAt, &t.TraceID, &t.Traceparent, &t.RetryOf, &t.IdempotencyKey, &t.QueuedAt, &t.Run, &t.CreatedAt, &t.UpdatedAt)
	return t, err
}

// scanView scans taskColumns followed by viewColumns.
func scanView(row pgx.Row) (Task, error) {
	var t Task
	err := row.Scan(viewDest(&t)...)
	return t, err
}

// viewDest is where taskColumns and viewColumns scan into.
func viewDest(t *Task) []any {
	return []any{&t.ID, &t.Owner, &t.Repo, &t.BaseBranch, &t.HeadBranch, &t.Prompt, &t.Agent, &t.Status, &t.Stage,
		&t.Diff.Additions, &t.Diff.Deletions, &t.Diff.FilesChanged, &t.PRURL, &t.PRNumber, &t.FailedReason,
		&t.Usage.CostUSD, &t.Usage.TokensIn, &t.Usage.TokensOut,
		&t.DeadlineAt, &t.LastSeq, &t.HeartbeatAt, &t.TraceID, &t.Traceparent, &t.RetryOf, &t.IdempotencyKey, &t.QueuedAt, &t.Run, &t.CreatedAt, &t.UpdatedAt,
		&t.TimelineSeq, &t.QueuePosition}
}

const insertTask = `INSERT INTO tasks (id, owner, repo, base_branch, head_branch, prompt, agent, status, retry_of, idempotency_key, trace_id, traceparent)
VALUES ($1, $2, $3, $4, $5, $6, $7, 'proposing', $8, $9, $10, $11)
ON CONFLICT (owner, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING ` + taskColumns

const insertFirstRun = `INSERT INTO task_runs (task_id, number, trigger, requested_by) VALUES ($1, 1, 'create', $2)`

const selectByKey = `SELECT ` + taskColumns + `, ` + viewColumns + ` FROM tasks WHERE owner = $1 AND idempotency_key = $2`

// Create inserts a task, or returns the task created earlier with the same
// idempotency key (created = false). A reused key with different parameters
// is a conflict.
func (s *Store) Create(ctx context.Context, n NewTask, traceparent string) (t Task, created bool, err error) {
	id := uuid.NewString()
	var key, retryOf *string
	if n.IdempotencyKey != "" {
		key = &n.IdempotencyKey
	}
	if n.RetryOf != "" {
		retryOf = &n.RetryOf
	}
	err = s.InTx(ctx, func(tx *Tx) error {
		var err error
		t, err = scanTask(tx.QueryRow(ctx, insertTask, id, n.Owner, n.Repo, n.BaseBranch, HeadBranch(id), n.Prompt, n.Agent, retryOf, key,
			traceIDOf(traceparent), traceparent))
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, insertFirstRun, t.ID, string(UserActor(n.Owner))); err != nil {
			return err
		}
		reason := "created"
		if n.RetryOf != "" {
			reason = "created as a retry of " + n.RetryOf
		}
		return tx.appendStatusChange(ctx, t.ID, "", StatusProposing, reason, UserActor(n.Owner), 0)
	})
	if err == nil {
		return t, true, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) || key == nil {
		return Task{}, false, err
	}
	// The key exists: ON CONFLICT DO NOTHING waited for the other insert.
	t, err = scanView(s.pool.QueryRow(ctx, selectByKey, n.Owner, n.IdempotencyKey))
	if err != nil {
		return Task{}, false, err
	}
	if t.Repo != n.Repo || t.BaseBranch != n.BaseBranch || t.Prompt != n.Prompt || t.Agent != n.Agent || t.RetryOf != n.RetryOf {
		return Task{}, false, errs.Conflict("idempotency key %q was already used for a different request", n.IdempotencyKey)
	}
	return t, false, nil
}

const selectTask = `SELECT ` + taskColumns + `, ` + viewColumns + ` FROM tasks WHERE id = $1 AND ($2 = '' OR owner = $2)`

// Get returns a task; owner "" matches any owner. Another owner's task is
// NotFound, exactly like a missing one.
func (s *Store) Get(ctx context.Context, id, owner string) (Task, error) {
	t, err := scanView(s.pool.QueryRow(ctx, selectTask, id, owner))
	if errors.Is(err, pgx.ErrNoRows) {
		return Task{}, errs.NotFound("task", id)
	}
	return t, err
}

// QueueGet queues Get's read on b, for a caller that reads more in the same
// round trip: when the batch results are read, *into is the task and
// *found whether it exists and owner may see it (owner "" matches any).
// The caller answers NotFound when it was not found, exactly like Get.
func QueueGet(b *pgx.Batch, id, owner string, into *Task, found *bool) {
	b.Queue(selectTask, id, owner).QueryRow(func(row pgx.Row) error {
		t, err := scanView(row)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			*found = false
			return nil
		case err != nil:
			return err
		}
		*into, *found = t, true
		return nil
	})
}

// selectShown is selectTask with the budget set at create (0: none).
const selectShown = `SELECT ` + taskColumns + `, ` + viewColumns + `, coalesce(max_budget_usd, 0)::float8 FROM tasks WHERE id = $1 AND ($2 = '' OR owner = $2)`

// Shown returns a task as GetTask shows it: the row, the budget set at
// create (0: none) and, when runs is true, its runs (see Runs), read in one
// round trip and one implicit transaction. Owner and NotFound are as in Get;
// another owner's runs are read with the rest and dropped.
func (s *Store) Shown(ctx context.Context, id, owner string, runs bool) (Task, float64, error) {
	var t Task
	var budget float64
	found := false
	b := &pgx.Batch{}
	b.Queue(selectShown, id, owner).QueryRow(func(row pgx.Row) error {
		err := row.Scan(append(viewDest(&t), &budget)...)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		found = err == nil
		return err
	})
	if runs {
		b.Queue(runsOf, id).Query(func(rows pgx.Rows) error {
			if !found {
				return nil
			}
			return scanRuns(rows, &t)
		})
	}
	if err := s.pool.SendBatch(ctx, b).Close(); err != nil {
		return Task{}, 0, err
	}
	if !found {
		return Task{}, 0, errs.NotFound("task", id)
	}
	return t, budget, nil
}

// Filter narrows List.
type Filter struct {
	Status Status
	Repo   string
}

type cursor struct {
	CreatedAt time.Time `json:"c"`
	ID        string    `json:"i"`
}

// EncodeCursor makes an opaque page token.
func encodeCursor(t Task) string {
	b, _ := json.Marshal(cursor{t.CreatedAt, t.ID})
	return base64.RawURLEncoding.EncodeToString(b)
}

func decodeCursor(tok string) (*cursor, error) {
	if tok == "" {
		return nil, nil
	}
	b, err := base64.RawURLEncoding.DecodeString(tok)
	var c cursor
	if err == nil {
		err = json.Unmarshal(b, &c)
	}
	if err == nil {
		_, err = uuid.Parse(c.ID)
	}
	if err != nil || c.ID == "" {
		return nil, errs.Invalid("page_token", "is not a token returned by ListTasks")
	}
	return &c, nil
}

const listTasks = `SELECT ` + taskColumns + `, ` + viewColumns + ` FROM tasks
WHERE owner = $1
  AND ($2 = '' OR status = $2)
  AND ($3 = '' OR repo = $3)
  AND ($4::timestamptz IS NULL OR (created_at, id) < ($4, $5::uuid))
ORDER BY created_at DESC, id DESC
LIMIT $6`

// List returns one page of an owner's tasks, newest first.
func (s *Store) List(ctx context.Context, owner string, f Filter, pageSize int, pageToken string) ([]Task, string, error) {
	c, err := decodeCursor(pageToken)
	if err != nil {
		return nil, "", err
	}
	var after *time.Time
	afterID := uuid.Nil.String()
	if c != nil {
		after, afterID = &c.CreatedAt, c.ID
	}
	rows, err := s.pool.Query(ctx, listTasks, owner, string(f.Status), f.Repo, after, afterID, pageSize+1)
	if err != nil {
		return nil, "", err
	}
	tasks, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Task, error) { return scanView(r) })
	if err != nil {
		return nil, "", err
	}
	next := ""
	if len(tasks) > pageSize {
		tasks = tasks[:pageSize]
		next = encodeCursor(tasks[len(tasks)-1])
	}
	return tasks, next, nil
}

const (
	lockTask      = `SELECT ` + taskColumns + ` FROM tasks WHERE id = $1 AND ($2 = '' OR owner = $2) FOR UPDATE`
	hasSandbox    = `SELECT EXISTS (SELECT 1 FROM sandboxes WHERE task_id = $1)`
	rememberReq   = `INSERT INTO task_requests (task_id, request_id) VALUES ($1, $2) ON CONFLICT DO NOTHING`
	updateAdvance = `UPDATE tasks SET status = $2, stage = $3, additions = $4, deletions = $5, files_changed = $6,
	pr_url = $7, pr_number = $8, failed_reason = $9, cost_usd = $10, tokens_in = $11, tokens_out = $12,
	last_seq = greatest(last_seq, $13), heartbeat_at = CASE WHEN $14 THEN now() ELSE heartbeat_at END,
	queued_at = CASE WHEN $2 = 'queued' AND status <> 'queued' THEN now() ELSE queued_at END,
	updated_at = now()
WHERE id = $1
RETURNING ` + taskColumns
)

// Advance applies a transition atomically and idempotently: a repeated Seq or
// RequestID returns the current task with applied = false and changes nothing.
// A status change appends its status_change event in the same transaction.
func (s *Store) Advance(ctx context.Context, id, owner string, a Advance) (t Task, applied bool, err error) {
	err = s.InTx(ctx, func(tx *Tx) error {
		var err error
		t, applied, err = tx.Advance(ctx, id, owner, a)
		return err
	})
	return t, applied, err
}

// Advance is Store.Advance inside tx, so other services (Dispatch) can commit
// a transition with their own rows.
func (tx *Tx) Advance(ctx context.Context, id, owner string, a Advance) (Task, bool, error) {
	cur, err := scanTask(tx.QueryRow(ctx, lockTask, id, owner))
	if errors.Is(err, pgx.ErrNoRows) {
		return Task{}, false, errs.NotFound("task", id)
	}
	if err != nil {
		return Task{}, false, err
	}
	if a.Seq > 0 && a.Seq <= cur.LastSeq {
		return cur, false, nil
	}
	if a.RequestID != "" {
		tag, err := tx.Exec(ctx, rememberReq, id, a.RequestID)
		if err != nil {
			return Task{}, false, err
		}
		if tag.RowsAffected() == 0 {
			return cur, false, nil
		}
	}
	sandbox := false
	if a.Status == StatusRunning && cur.Status != StatusRunning {
		if err := tx.QueryRow(ctx, hasSandbox, id).Scan(&sandbox); err != nil {
			return Task{}, false, err
		}
	}
	n, err := Apply(cur, a, sandbox)
	if err != nil {
		return cur, false, err
	}
	out, err := scanTask(tx.QueryRow(ctx, updateAdvance, saveArgs(n, a.Seq, a.Heartbeat)...))
	if err != nil {
		return Task{}, false, err
	}
	if out.Status != cur.Status {
		if err := tx.statusChanged(ctx, cur, out, a); err != nil {
			return Task{}, false, err
		}
	}
	return out, true, nil
}

// traceIDOf extracts the trace id from a W3C traceparent
// ("00-<trace id>-<span id>-<flags>").
func traceIDOf(tp string) string {
	parts := strings.Split(tp, "-")
	if len(parts) != 4 || len(parts[1]) != 32 {
		return ""
	}
	return parts[1]
}
