package dispatch

import (
	"context"
	"errors"
	"time"

	"github.com/cenkalti/backoff/v5"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/taskrunner/taskrunner/services/errs"
	"github.com/taskrunner/taskrunner/services/sandbox"
	"github.com/taskrunner/taskrunner/services/task"
)

// ReapResult counts what one reaper cycle did.
type ReapResult struct {
	TimedOut, Lost, Orphans int
}

// reaperLock lets one replica reap at a time; the others skip the cycle.
const reaperLock = 72610002

// Reap runs one reaper cycle:
//   - running tasks past their deadline (plus the cancel grace the runner gets
//     to report its own timeout) → sandbox destroyed, task failed "timeout";
//   - running tasks without a heartbeat for 3 intervals → failed
//     "runner_lost", sandbox destroyed;
//   - sandboxes carrying our labels whose task is missing or finished, older
//     than the orphan grace → destroyed (this also cleans up after a
//     Dispatch that was killed).
func (s *Server) Reap(ctx context.Context) (res ReapResult, err error) {
	conn, err := s.d.Pool.Acquire(ctx)
	if err != nil {
		return res, err
	}
	defer conn.Release()
	var got bool
	if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, reaperLock).Scan(&got); err != nil || !got {
		return res, err
	}
	defer func() { _, _ = conn.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock($1)`, reaperLock) }()
	ctx, span := tracer.Start(ctx, "reaper")
	defer func() {
		span.SetAttributes(attribute.Int("taskrunner.reaper.timed_out", res.TimedOut), attribute.Int("taskrunner.reaper.runner_lost", res.Lost),
			attribute.Int("taskrunner.reaper.orphans", res.Orphans))
		span.End()
	}()
	count := func(action, taskID string) {
		s.m.reaper.Add(ctx, 1, metric.WithAttributes(attribute.String("action", action)))
		span.AddEvent(action, trace.WithAttributes(attribute.String("taskrunner.task_id", taskID)))
	}

	timedOut, err := s.tasks.PastDeadline(ctx, s.cfg.CancelGrace)
	if err != nil {
		return res, err
	}
	for _, id := range timedOut {
		s.destroy(ctx, id, "timeout")
		if s.fail(ctx, id, "timeout", "reaper:timeout") {
			res.TimedOut++
			count("timeout", id)
		}
	}
	// After its own start the reaper waits one full window before judging
	// silence: runners reconnecting to a restarted control plane must have
	// had the time to say something.
	var lost []string
	if s.judgeSilence() {
		lost, err = s.tasks.Silent(ctx, 3*s.cfg.HeartbeatInterval)
		if err != nil {
			return res, err
		}
	}
	for _, id := range lost {
		if s.fail(ctx, id, "runner_lost: nothing heard from the runner for "+(3*s.cfg.HeartbeatInterval).String(), "reaper:lost") {
			res.Lost++
			count("runner_lost", id)
		}
		s.destroy(ctx, id, "runner_lost")
	}

	sbs, err := s.d.Provider.List(ctx, map[string]string{sandbox.LabelManagedBy: sandbox.ManagedByValue})
	if err != nil {
		return res, err
	}
	for _, sb := range sbs {
		if time.Since(sb.CreatedAt) < s.cfg.OrphanGrace {
			continue
		}
		t, err := s.tasks.Get(ctx, sb.TaskID(), "")
		live := err == nil && !t.Status.Terminal()
		if err != nil && !errors.Is(err, errs.ErrNotFound) {
			if task.ValidateID("id", sb.TaskID()) == nil {
				continue // database trouble: do not destroy on a guess
			}
		}
		if live {
			continue
		}
		if err := s.d.Provider.Destroy(ctx, sb.ID); err != nil {
			s.log.ErrorContext(ctx, "reaper: destroy orphan", "sandbox_id", sb.ID, "error", err)
			continue
		}
		if task.ValidateID("id", sb.TaskID()) == nil {
			_, _ = s.d.Pool.Exec(ctx, `UPDATE sandboxes SET state = 'destroyed', destroyed_at = now() WHERE task_id = $1 AND destroyed_at IS NULL`, sb.TaskID())
		}
		s.log.InfoContext(ctx, "reaper: orphan sandbox destroyed", "sandbox_id", sb.ID, "task_id", sb.TaskID())
		res.Orphans++
		count("orphan", sb.TaskID())
	}
	if res != (ReapResult{}) {
		s.log.InfoContext(ctx, "reaper cycle", "timed_out", res.TimedOut, "runner_lost", res.Lost, "orphans", res.Orphans)
	}
	return res, nil
}

// judgeSilence reports whether the reaper has run for a full silence window
// (3 heartbeat intervals) since this server started or since a cycle last
// failed (outage).
func (s *Server) judgeSilence() bool {
	return time.Since(s.born) >= 3*s.cfg.HeartbeatInterval
}

// outage restarts the reaper's grace: a cycle failed, most likely because
// the database is unreachable, and while it is, no runner's heartbeat or
// event can be recorded. Judging silence as soon as it is back would fail
// live runners whose messages are still on their way (issue 19's
// PostgreSQL outage). Resume, the only other reader of born, runs before
// the first cycle.
func (s *Server) outage() { s.born = time.Now() }

func (s *Server) fail(ctx context.Context, id, reason, requestID string) bool {
	_, applied, err := s.tasks.Advance(ctx, id, "", task.Advance{RequestID: requestID, Status: task.StatusFailed, FailedReason: reason, Actor: task.ActorReaper})
	if err != nil && !errors.Is(err, errs.ErrInvalidTransition) {
		s.log.ErrorContext(ctx, "reaper: fail task", "task_id", id, "error", err)
	}
	if applied {
		s.log.InfoContext(ctx, "reaper: task failed", "task_id", id, "reason", reason)
	}
	return applied
}

// RunReaper first starts the sandboxes a killed Dispatch admitted but never
// created (Resume), then reaps every interval until ctx ends.
func (s *Server) RunReaper(ctx context.Context) {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval, b.MaxInterval = 100*time.Millisecond, s.cfg.ReaperInterval
	n, err := backoff.Retry(ctx, func() (int, error) { return s.Resume(ctx) },
		backoff.WithBackOff(b), backoff.WithMaxElapsedTime(0), backoff.WithNotify(func(err error, delay time.Duration) {
			s.log.WarnContext(ctx, "dispatch: could not look for sandbox starts to resume; retrying", "error", err, "delay", delay)
		}))
	if err != nil {
		return // ctx ended
	}
	if n > 0 {
		s.log.InfoContext(ctx, "dispatch: resumed sandbox starts", "tasks", n)
	}
	t := time.NewTicker(s.cfg.ReaperInterval)
	defer t.Stop()
	for {
		if _, err := s.Reap(ctx); err != nil && ctx.Err() == nil {
			s.log.ErrorContext(ctx, "reaper cycle failed", "error", err)
			s.outage()
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
