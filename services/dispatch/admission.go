package dispatch

import (
	"context"
	"fmt"
	"math"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"

	"github.com/taskrunner/taskrunner/services/errs"
	"github.com/taskrunner/taskrunner/services/task"
)

// Admission: DispatchTask admits a task (or queues it) under the admission lock; the queue
// drains in FIFO order when capacity frees (Listen, drainQueue).

// admissionLock serialises admission decisions across replicas; the
// decisions are short, so one transaction-scoped advisory lock is simpler
// and safer than per-repository locking.
const admissionLock = `SELECT pg_advisory_xact_lock(72610001)`

// insertSandbox records the sandbox of the task's current run.
const insertSandbox = `INSERT INTO sandboxes (task_id, run, provider, state) SELECT $1, run, $2, 'creating' FROM tasks WHERE id = $1`

// admitted is a task whose current run must be started after commit.
type admitted struct {
	id       string
	deadline time.Time
}

// DispatchTask implements task.Dispatcher: it admits the task (its sandbox
// is then started in the background) or queues it. Repeated and concurrent
// calls never start a second sandbox: the first caller moves the task out
// of proposing under a row lock. Starting the sandbox is work that
// outlives the request: a client that goes away after admission committed
// does not fail the task.
func (s *Server) DispatchTask(ctx context.Context, taskID string) (tk task.Task, err error) {
	began := time.Now()
	ctx, span := s.taskSpan(ctx, taskID, "dispatch")
	defer func() {
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		}
		span.SetAttributes(attribute.String("taskrunner.status", string(tk.Status)))
		span.End()
		s.m.latency.Record(ctx, time.Since(began).Seconds(), metric.WithAttributes(attribute.Bool("ok", err == nil)))
	}()
	var start *admitted
	err = s.tasks.InTx(ctx, func(tx *task.Tx) error {
		start = nil
		if _, err := tx.Exec(ctx, admissionLock); err != nil {
			return err
		}
		owner, repo, status, err := tx.LockForAdmission(ctx, taskID)
		if err != nil {
			return err
		}
		if status != task.StatusProposing {
			if status.Terminal() {
				return errs.Transition("task %s is %s: it cannot be dispatched (retry it instead)", taskID, status)
			}
			return nil // already admitted: idempotent
		}
		n, oldest, err := tx.DispatchedInWindow(ctx, owner)
		if err != nil {
			return err
		}
		if n >= s.cfg.PerOwnerPerDay {
			retry := int64(3600)
			if oldest != nil {
				retry = int64(math.Ceil(time.Until(oldest.Add(24 * time.Hour)).Seconds()))
				retry = max(retry, 1)
			}
			return errs.Quota(retry, "owner %q reached %d dispatched tasks in 24 hours; retry in %d s", owner, s.cfg.PerOwnerPerDay, retry)
		}
		if err := s.checkOwnerSpend(ctx, tx, owner); err != nil {
			return err
		}
		if err := tx.MarkDispatched(ctx, taskID); err != nil {
			return err
		}
		repoRunning, global, err := tx.RunningCounts(ctx, repo)
		if err != nil {
			return err
		}
		ahead, err := tx.QueuedForRepo(ctx, repo)
		if err != nil {
			return err
		}
		if ahead || repoRunning >= s.cfg.PerRepoRunning || global >= s.cfg.GlobalRunning {
			why := fmt.Sprintf("waiting for capacity: %d of %d running in %s, %d of %d in all", repoRunning, s.cfg.PerRepoRunning, repo, global, s.cfg.GlobalRunning)
			if ahead {
				why = "waiting behind earlier tasks of " + repo
			}
			_, _, err := tx.Advance(ctx, taskID, "", task.Advance{RequestID: "dispatch:queue", Status: task.StatusQueued,
				Actor: task.UserActor(owner), Reason: why})
			return err
		}
		a, err := s.admitTx(ctx, tx, taskID, task.UserActor(owner), "admitted")
		start = a
		return err
	})
	if err != nil {
		return task.Task{}, err
	}
	if start != nil {
		s.launch(ctx, *start)
	}
	return s.tasks.Get(ctx, taskID, "")
}

// admitTx records the sandbox and moves the task to running.
func (s *Server) admitTx(ctx context.Context, tx *task.Tx, taskID string, actor task.Actor, why string) (*admitted, error) {
	if _, err := tx.Exec(ctx, insertSandbox, taskID, s.d.Provider.Name()); err != nil {
		return nil, err
	}
	if _, _, err := tx.Advance(ctx, taskID, "", task.Advance{RequestID: "dispatch:run", Status: task.StatusRunning, Actor: actor, Reason: why}); err != nil {
		return nil, err
	}
	deadline, err := tx.MarkStarted(ctx, taskID, s.cfg.TaskTimeout)
	if err != nil {
		return nil, err
	}
	return &admitted{id: taskID, deadline: deadline}, nil
}

// drainQueue starts queued tasks, oldest first, while capacity allows. Any
// replica may run it; the admission lock makes the decisions serial.
func (s *Server) drainQueue(ctx context.Context) {
	for ctx.Err() == nil {
		var start *admitted
		err := s.tasks.InTx(ctx, func(tx *task.Tx) error {
			start = nil
			if _, err := tx.Exec(ctx, admissionLock); err != nil {
				return err
			}
			queued, err := tx.OldestQueued(ctx, 200)
			if err != nil || len(queued) == 0 {
				return err
			}
			running, total, err := tx.RunningByRepo(ctx)
			if err != nil || total >= s.cfg.GlobalRunning {
				return err
			}
			for _, c := range queued {
				if running[c.Repo] < s.cfg.PerRepoRunning {
					a, err := s.admitTx(ctx, tx, c.ID, task.ActorDispatch, "capacity freed: admitted from the queue")
					start = a
					return err
				}
			}
			return nil
		})
		if err != nil {
			if ctx.Err() == nil {
				s.log.ErrorContext(ctx, "queue drain failed", "error", err)
			}
			return
		}
		if start == nil {
			return
		}
		qctx, span := s.taskSpan(ctx, start.id, "dispatch")
		span.SetAttributes(attribute.Bool("taskrunner.from_queue", true))
		s.log.InfoContext(qctx, "queued task admitted", "task_id", start.id)
		s.launch(qctx, *start)
		span.End()
	}
}

// Listen wakes the queue whenever a task leaves running (PostgreSQL
// NOTIFY from a trigger), and every interval as a safety net. It blocks
// until ctx ends.
func (s *Server) Listen(ctx context.Context, interval time.Duration) {
	wake := make(chan struct{}, 1)
	go func() {
		for ctx.Err() == nil {
			if err := s.listenOnce(ctx, wake); err != nil && ctx.Err() == nil {
				s.log.WarnContext(ctx, "capacity listener reconnecting", "error", err)
				select {
				case <-ctx.Done():
				case <-time.After(time.Second):
				}
			}
		}
	}()
	t := time.NewTicker(interval)
	defer t.Stop()
	s.wake = wake
	for {
		s.releaseFinished(ctx)
		s.startPendingRuns(ctx)
		s.drainQueue(ctx)
		select {
		case <-ctx.Done():
			return
		case <-wake:
		case <-t.C:
		}
	}
}

func (s *Server) listenOnce(ctx context.Context, wake chan<- struct{}) error {
	conn, err := s.d.Pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "LISTEN taskrunner_capacity"); err != nil {
		return err
	}
	defer func() { _, _ = conn.Exec(context.WithoutCancel(ctx), "UNLISTEN taskrunner_capacity") }()
	for {
		if _, err := conn.Conn().WaitForNotification(ctx); err != nil {
			return err
		}
		select {
		case wake <- struct{}{}:
		default:
		}
	}
}

// recheck wakes Listen again after d (a finished runner's grace).
func (s *Server) recheck(d time.Duration) {
	if s.wake == nil {
		return
	}
	time.AfterFunc(d, func() {
		select {
		case s.wake <- struct{}{}:
		default:
		}
	})
}
