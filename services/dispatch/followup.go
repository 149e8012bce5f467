package dispatch

import (
	"context"
	"math"
	"time"

	"go.opentelemetry.io/otel/attribute"

	"github.com/taskrunner/taskrunner/services/errs"
	"github.com/taskrunner/taskrunner/services/task"
)

// Follow-ups: the next pending run of a task starts when no run is active.

// StartFollowUp implements task.Dispatcher: when the task has no active run,
// its oldest pending follow-up starts (running, or queued when capacity is
// short), counted against the owner's daily quota like a dispatch.
func (s *Server) StartFollowUp(ctx context.Context, taskID string) (task.Task, error) {
	ctx, span := s.taskSpan(ctx, taskID, "dispatch")
	span.SetAttributes(attribute.Bool("taskrunner.follow_up", true))
	defer span.End()
	var start *admitted
	err := s.tasks.InTx(ctx, func(tx *task.Tx) error {
		start = nil
		if _, err := tx.Exec(ctx, admissionLock); err != nil {
			return err
		}
		cur, err := tx.Lock(ctx, taskID)
		if err != nil {
			return err
		}
		if cur.Status != task.StatusAwaitingReview && cur.Status != task.StatusFailed {
			return nil // a run is active (the follow-up waits) or the task is closed
		}
		p, ok, err := tx.NextPendingRun(ctx, cur)
		if err != nil || !ok {
			return err
		}
		n, oldest, err := tx.DispatchedInWindow(ctx, cur.Owner)
		if err != nil {
			return err
		}
		if n >= s.cfg.PerOwnerPerDay {
			retry := int64(3600)
			if oldest != nil {
				retry = max(int64(math.Ceil(time.Until(oldest.Add(24*time.Hour)).Seconds())), 1)
			}
			return errs.Quota(retry, "owner %q reached %d runs in 24 hours; retry in %d s", cur.Owner, s.cfg.PerOwnerPerDay, retry)
		}
		if err := s.checkOwnerSpend(ctx, tx, cur.Owner); err != nil {
			return err
		}
		repoRunning, global, err := tx.RunningCounts(ctx, cur.Repo)
		if err != nil {
			return err
		}
		to := task.StatusRunning
		if repoRunning >= s.cfg.PerRepoRunning || global >= s.cfg.GlobalRunning {
			to = task.StatusQueued
		}
		if _, err := tx.StartRun(ctx, cur, p, to); err != nil {
			return err
		}
		if to == task.StatusQueued {
			return nil
		}
		if _, err := tx.Exec(ctx, insertSandbox, taskID, s.d.Provider.Name()); err != nil {
			return err
		}
		deadline, err := tx.MarkStarted(ctx, taskID, s.cfg.TaskTimeout)
		if err != nil {
			return err
		}
		start = &admitted{id: taskID, deadline: deadline}
		return nil
	})
	if err != nil {
		span.RecordError(err)
		return task.Task{}, err
	}
	if start != nil {
		s.launch(ctx, *start)
	}
	return s.tasks.Get(ctx, taskID, "")
}

// startPendingRuns starts the follow-ups that wait behind runs which have
// ended since.
func (s *Server) startPendingRuns(ctx context.Context) {
	ids, err := s.tasks.TasksWithPendingRuns(ctx, 100)
	if err != nil {
		if ctx.Err() == nil {
			s.log.ErrorContext(ctx, "list pending follow-ups", "error", err)
		}
		return
	}
	for _, id := range ids {
		if _, err := s.StartFollowUp(ctx, id); err != nil && ctx.Err() == nil {
			s.log.WarnContext(ctx, "follow-up not started yet", "task_id", id, "error", err)
		}
	}
}
