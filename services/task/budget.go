package task

import (
	"context"
	"errors"
	"math"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/taskrunner/taskrunner/services/errs"
)

// Budgets are the server's spending limits that TaskService shows and
// checks at create. The model proxy enforces the per-task budget and
// Dispatch the owner's daily quota; both read the same variables.
type Budgets struct {
	// MaxBudgetUSD is the most one task may spend on model calls, and the
	// bound of a budget set at create.
	MaxBudgetUSD float64 `env:"TASKRUNNER_MAX_BUDGET_USD" envDefault:"5"`
	// OwnerDailyUSD is what one owner's tasks created since 00:00 UTC may
	// spend (0: no quota).
	OwnerDailyUSD float64 `env:"TASKRUNNER_OWNER_DAILY_USD" envDefault:"0"`
}

// DefaultMaxBudgetUSD is TASKRUNNER_MAX_BUDGET_USD's default.
const DefaultMaxBudgetUSD = 5

// Validate checks the limits.
func (b Budgets) Validate() error {
	switch {
	case !(b.MaxBudgetUSD > 0) || math.IsInf(b.MaxBudgetUSD, 0):
		return errors.New("TASKRUNNER_MAX_BUDGET_USD: must be a positive number of USD")
	case !(b.OwnerDailyUSD >= 0) || math.IsInf(b.OwnerDailyUSD, 0):
		return errors.New("TASKRUNNER_OWNER_DAILY_USD: must not be negative (0: no quota)")
	}
	return nil
}

// EffectiveBudget is what a task may spend: the budget set at create
// (0: none), bounded by the server's maximum.
func EffectiveBudget(set, serverMax float64) float64 {
	if set > 0 && set < serverMax {
		return set
	}
	return serverMax
}

// The per-task budget lives in its own column (migration 00008), written
// once right after the row is created, before anything is dispatched.
const (
	setBudget     = `UPDATE tasks SET max_budget_usd = $2 WHERE id = $1`
	selectBudgets = `SELECT id::text, coalesce(max_budget_usd, 0)::float8 FROM tasks WHERE id = ANY($1::uuid[])`
	// ownerSpentToday is what an owner's tasks created since 00:00 UTC have
	// spent on model calls, every run counted (tasks.cost_usd holds only the
	// current run's cost: a run's cost is the last usage its runner or the
	// model proxy recorded), and when that day ends, by the database's clock.
	// Each run's cost is its last usage event (the model proxy's totals);
	// the current run's may also be on the task row only (a runner that
	// reports usage itself, without the proxy), so the larger counts.
	ownerSpentToday = `SELECT coalesce(sum(
	coalesce((SELECT sum(u.cost) FROM task_runs r CROSS JOIN LATERAL (SELECT (e.payload->'usage'->>'cost_usd')::float8 AS cost FROM task_events e
		WHERE e.task_id = r.task_id AND e.run = r.number AND e.type = 'usage' ORDER BY e.seq DESC LIMIT 1) u
	WHERE r.task_id = t.id AND r.number < t.run), 0)
	+ greatest(t.cost_usd, coalesce((SELECT (e.payload->'usage'->>'cost_usd')::float8 FROM task_events e
		WHERE e.task_id = t.id AND e.run = t.run AND e.type = 'usage' ORDER BY e.seq DESC LIMIT 1), 0))), 0)::float8,
	(date_trunc('day', now() AT TIME ZONE 'UTC') + interval '1 day') AT TIME ZONE 'UTC'
FROM tasks t
WHERE t.owner = $1 AND t.created_at >= (date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC')`
)

// SetBudget records the budget set at create (USD, > 0).
func (s *Store) SetBudget(ctx context.Context, id string, usd float64) error {
	tag, err := s.pool.Exec(ctx, setBudget, id, usd)
	if err == nil && tag.RowsAffected() == 0 {
		return errs.NotFound("task", id)
	}
	return err
}

// Budgets returns the budgets set at create of the given tasks (0: none set;
// unknown ids are absent).
func (s *Store) Budgets(ctx context.Context, ids ...string) (map[string]float64, error) {
	out := make(map[string]float64, len(ids))
	if len(ids) == 0 {
		return out, nil
	}
	rows, err := s.pool.Query(ctx, selectBudgets, ids)
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var id string
		var usd float64
		if err := rows.Scan(&id, &usd); err != nil {
			rows.Close()
			return nil, err
		}
		out[id] = usd
	}
	return out, rows.Err()
}

// Budget is one task's budget set at create (0: none set).
func (s *Store) Budget(ctx context.Context, id string) (float64, error) {
	m, err := s.Budgets(ctx, id)
	if err != nil {
		return 0, err
	}
	usd, ok := m[id]
	if !ok {
		return 0, errs.NotFound("task", id)
	}
	return usd, nil
}

// OwnerSpentToday is what the owner's tasks created since 00:00 UTC have
// spent on model calls (all their runs), and when that day ends.
func (s *Store) OwnerSpentToday(ctx context.Context, owner string) (spent float64, resets time.Time, err error) {
	return ownerSpent(ctx, s.pool, owner)
}

// OwnerSpentToday is Store.OwnerSpentToday inside an admission transaction
// (Dispatch's owner quota: one definition of the day's spend).
func (tx *Tx) OwnerSpentToday(ctx context.Context, owner string) (spent float64, resets time.Time, err error) {
	return ownerSpent(ctx, tx, owner)
}

func ownerSpent(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, owner string) (spent float64, resets time.Time, err error) {
	err = q.QueryRow(ctx, ownerSpentToday, owner).Scan(&spent, &resets)
	if errors.Is(err, pgx.ErrNoRows) {
		err = nil
	}
	return spent, resets, err
}
