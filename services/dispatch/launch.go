package dispatch

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
	"github.com/taskrunner/taskrunner/services/sandbox"
	"github.com/taskrunner/taskrunner/services/task"
)

// Launching: a sandbox is started in the background with backoff after admission commits, and
// destroyed (and released) as soon as its runner has finished.

// launch starts an admitted task's sandbox in the background, under no
// request's context (only the trace carries over).
func (s *Server) launch(ctx context.Context, a admitted) {
	ctx = context.WithoutCancel(ctx)
	s.starting.Add(1)
	go func() {
		defer s.starting.Done()
		s.start(ctx, a)
	}()
}

// Wait blocks until every sandbox start in progress has finished (for
// shutdown and tests).
func (s *Server) Wait() { s.starting.Wait() }

// startAttempts bounds the tries of Provider.Create (idempotent per task)
// before the task fails.
const startAttempts = 4

// start mints the task certificate and creates the sandbox, retrying with
// backoff. Either outcome is on the task's timeline: a sandbox "started"
// event, or a "failed" one and the task failed (the sandbox row records
// it), so nothing waits for a runner that never started.
func (s *Server) start(ctx context.Context, a admitted) {
	ctx, span := tracer.Start(ctx, "sandbox.create", trace.WithAttributes(attribute.String("taskrunner.task_id", a.id),
		attribute.String("taskrunner.provider", s.d.Provider.Name())))
	defer span.End()
	t, err := s.tasks.Get(ctx, a.id, "")
	if err == nil && t.Status != task.StatusRunning {
		s.log.InfoContext(ctx, "sandbox not started: the task is no longer running", "task_id", a.id, "status", t.Status)
		return
	}
	var sb sandbox.Sandbox
	if err == nil && t.Run > 1 {
		// A follow-up reuses the task's sandbox name: the last run's
		// sandbox must be gone first.
		s.destroyRuns(ctx, a.id, fmt.Sprintf("run %d starts", t.Run), t.Run)
	}
	if err == nil {
		sb, err = backoff.Retry(ctx, func() (sandbox.Sandbox, error) {
			sb, err := s.create(ctx, t, a.deadline)
			if err != nil {
				s.log.WarnContext(ctx, "sandbox create failed; retrying", "task_id", a.id, "error", err)
			}
			return sb, err
		}, backoff.WithBackOff(newStartBackOff()), backoff.WithMaxTries(startAttempts))
	}
	if err == nil {
		span.SetAttributes(attribute.String("taskrunner.sandbox_id", sb.ID), attribute.String("taskrunner.repo", t.Repo))
		state := string(sb.State)
		if state == "" {
			state = "running"
		}
		if _, err := s.d.Pool.Exec(ctx, `UPDATE sandboxes SET external_id = $2, state = $3 WHERE task_id = $1 AND run = $4`, a.id, sb.ID, state, max(t.Run, 1)); err != nil {
			// The sandbox runs; Destroy falls back to the name derived from the task id.
			s.log.ErrorContext(ctx, "record sandbox id", "task_id", a.id, "sandbox_id", sb.ID, "error", err)
		}
		s.sandboxEvent(ctx, a.id, "started", sb.ID, "")
		s.log.InfoContext(ctx, "sandbox created", "task_id", a.id, "provider", s.d.Provider.Name(), "sandbox_id", sb.ID)
		return
	}
	span.RecordError(err)
	span.SetStatus(codes.Error, err.Error())
	s.log.ErrorContext(ctx, "sandbox create failed", "task_id", a.id, "provider", s.d.Provider.Name(), "error", err)
	_, _ = s.d.Pool.Exec(ctx, `UPDATE sandboxes SET state = 'failed', destroyed_at = now() WHERE task_id = $1 AND state = 'creating'`, a.id)
	reason := "sandbox: " + err.Error()
	s.sandboxEvent(ctx, a.id, "failed", "", reason)
	if _, _, aerr := s.tasks.Advance(ctx, a.id, "", task.Advance{RequestID: "dispatch:start-failed",
		Status: task.StatusFailed, FailedReason: reason, Actor: task.ActorDispatch}); aerr != nil {
		s.log.ErrorContext(ctx, "could not fail task after sandbox error", "task_id", a.id, "error", aerr)
	}
}

func newStartBackOff() backoff.BackOff {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval, b.MaxInterval = 200*time.Millisecond, 2*time.Second
	return b
}

// sandboxEvent appends a SandboxState event to the task's timeline (it is
// not a status change: the task is running from admission on).
func (s *Server) sandboxEvent(ctx context.Context, taskID, state, sandboxID, reason string) {
	err := s.tasks.InTx(ctx, func(tx *task.Tx) error {
		if _, err := tx.Lock(ctx, taskID); err != nil {
			return err
		}
		return tx.Append(ctx, taskID, &taskrunnerv1.Event{Payload: &taskrunnerv1.Event_Sandbox{Sandbox: &taskrunnerv1.SandboxState{
			State: state, Provider: s.d.Provider.Name(), SandboxId: sandboxID, Reason: task.CleanReason(reason)}}})
	})
	if err != nil {
		s.log.ErrorContext(ctx, "could not record the sandbox on the timeline", "task_id", taskID, "state", state, "error", err)
	}
}

func (s *Server) create(ctx context.Context, t task.Task, deadline time.Time) (sandbox.Sandbox, error) {
	certPEM, keyPEM, err := s.d.CA.MintTaskCert(t.ID, deadline.Add(s.cfg.CancelGrace))
	if err != nil {
		return sandbox.Sandbox{}, backoff.Permanent(fmt.Errorf("mint task certificate: %w", err))
	}
	return s.d.Provider.Create(ctx, sandbox.Spec{
		TaskID: t.ID, Owner: t.Owner, Image: s.cfg.RunnerImage,
		Env:  s.RunnerEnv(ctx, t, deadline, certPEM, keyPEM),
		CPUs: s.cfg.RunnerCPUs, MemoryMB: s.cfg.RunnerMemoryMB, Deadline: deadline.Add(s.cfg.CancelGrace),
	})
}

// RunnerEnv is the whole environment of a sandbox (ARCHITECTURE.md section
// 5): task, events address, certificate, traceparent, agent and model
// settings, limits. It never contains a GitHub token.
func (s *Server) RunnerEnv(ctx context.Context, t task.Task, deadline time.Time, certPEM, keyPEM []byte) map[string]string {
	env := map[string]string{
		"TASKRUNNER_TASK_ID":        t.ID,
		"TASKRUNNER_REPO":           t.Repo,
		"TASKRUNNER_BASE_BRANCH":    t.BaseBranch,
		"TASKRUNNER_PROMPT":         t.Prompt,
		"TASKRUNNER_AGENT":          string(t.Agent),
		"TASKRUNNER_EVENTS_ADDR":    s.cfg.RunnerEventsAddr,
		"TASKRUNNER_TOKEN_ADDR":     s.cfg.RunnerTokenAddr,
		"TASKRUNNER_SERVER_NAME":    s.cfg.RunnerServerName,
		"TASKRUNNER_TLS_CERT_PEM":   string(certPEM),
		"TASKRUNNER_TLS_KEY_PEM":    string(keyPEM),
		"TASKRUNNER_TLS_CA_PEM":     string(s.d.CA.CertPEM()),
		"TASKRUNNER_DEADLINE":       deadline.UTC().Format(time.RFC3339),
		"TASKRUNNER_MAX_TURNS":      strconv.Itoa(s.cfg.MaxTurns),
		"TASKRUNNER_MAX_BUDGET_USD": strconv.FormatFloat(s.cfg.MaxBudgetUSD, 'f', -1, 64),
	}
	if tp := s.d.Traceparent(ctx); tp != "" {
		env["TRACEPARENT"] = tp
	}
	if s.cfg.RunnerModelProxyAddr != "" {
		// Every model call goes through the control plane's proxy, which
		// holds the keys (services/modelproxy); the task certificate is the
		// runner's credential there, worth a call only while the task runs.
		env["TASKRUNNER_MODEL_PROXY_ADDR"] = s.cfg.RunnerModelProxyAddr
	}
	if t.Run > 1 {
		// A follow-up: the same branch and pull request, a new request.
		env["TASKRUNNER_RUN"] = strconv.Itoa(int(t.Run))
		env["TASKRUNNER_FOLLOWUP_PROMPT"] = s.tasks.RunPrompt(ctx, t.ID, t.Run)
		env["TASKRUNNER_PR_URL"] = t.PRURL
		env["TASKRUNNER_PR_NUMBER"] = strconv.FormatInt(t.PRNumber, 10)
	}
	for _, k := range s.cfg.PassEnv {
		k = strings.TrimSpace(k)
		if k == "" || isGitHubSecret(k) || isCredential(k) {
			continue
		}
		if v := s.d.Getenv(k); v != "" {
			env[k] = v
		}
	}
	return env
}

// isGitHubSecret keeps GitHub credentials out of sandboxes even when an
// operator lists them in PassEnv by mistake.
func isGitHubSecret(k string) bool {
	k = strings.ToUpper(k)
	return strings.Contains(k, "GITHUB") || strings.HasPrefix(k, "GH_") || strings.Contains(k, "GIT_TOKEN")
}

// destroy removes the task's live sandboxes (idempotent; one per run at
// most), records it in the sandboxes table and on the task's timeline.
func (s *Server) destroy(ctx context.Context, taskID, why string) { s.destroyRuns(ctx, taskID, why, 0) }

// destroyRuns is destroy of the sandboxes of runs before run (0: all).
func (s *Server) destroyRuns(ctx context.Context, taskID, why string, before int32) {
	rows, err := s.d.Pool.Query(ctx, `SELECT run, external_id FROM sandboxes WHERE task_id = $1 AND destroyed_at IS NULL AND ($2 = 0 OR run < $2) ORDER BY run`, taskID, before)
	if err != nil {
		s.log.ErrorContext(ctx, "read sandbox", "task_id", taskID, "error", err)
		return
	}
	type live struct {
		run int32
		ext string
	}
	sbs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (live, error) {
		var l live
		return l, r.Scan(&l.run, &l.ext)
	})
	if err != nil {
		s.log.ErrorContext(ctx, "read sandbox", "task_id", taskID, "error", err)
		return
	}
	for _, sb := range sbs {
		ext := sb.ext
		if ext == "" {
			ext = sandbox.Name(taskID)
		}
		if err := s.d.Provider.Destroy(ctx, ext); err != nil {
			s.log.ErrorContext(ctx, "destroy sandbox", "task_id", taskID, "sandbox_id", ext, "error", err)
			continue
		}
		tag, _ := s.d.Pool.Exec(ctx, `UPDATE sandboxes SET state = 'destroyed', destroyed_at = now() WHERE task_id = $1 AND run = $2 AND destroyed_at IS NULL`, taskID, sb.run)
		if tag.RowsAffected() == 1 {
			s.sandboxEvent(ctx, taskID, "destroyed", ext, why)
		}
		s.log.InfoContext(ctx, "sandbox destroyed", "task_id", taskID, "sandbox_id", ext, "run", sb.run, "reason", why)
	}
}

// releaseFinished destroys the sandboxes of tasks that no longer run: a
// runner that reported its last event (completed, failed, cancelled) has
// nothing left to do, whatever the provider, so its sandbox and per-task
// files go once it has had CancelGrace to exit on its own (and flush its
// spans), not when the pull request closes.
func (s *Server) releaseFinished(ctx context.Context) {
	rows, err := s.d.Pool.Query(ctx, `SELECT DISTINCT task_id::text FROM sandboxes WHERE destroyed_at IS NULL AND state <> 'creating'`)
	if err != nil {
		s.log.ErrorContext(ctx, "list live sandboxes", "error", err)
		return
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil || len(ids) == 0 {
		return
	}
	sts, err := s.tasks.Statuses(ctx, ids)
	if err != nil {
		s.log.ErrorContext(ctx, "read task statuses", "error", err)
		return
	}
	for _, id := range ids {
		st, ok := sts[id]
		if !ok || st.Status == task.StatusRunning {
			continue
		}
		if wait := s.cfg.CancelGrace - time.Since(st.Changed); wait > 0 {
			s.recheck(wait)
			continue
		}
		s.destroy(ctx, id, "runner finished: task "+string(st.Status))
	}
}
