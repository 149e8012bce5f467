package dispatch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/types/known/timestamppb"

	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
	"github.com/taskrunner/taskrunner/services/auth"
	"github.com/taskrunner/taskrunner/services/errs"
	"github.com/taskrunner/taskrunner/services/pki"
	"github.com/taskrunner/taskrunner/services/sandbox"
	"github.com/taskrunner/taskrunner/services/task"
)

// Canceller pushes Cancel to the runner's stream (EventsService.Cancel).
type Canceller interface {
	Cancel(ctx context.Context, taskID, reason string) error
}

// Deps are the service's collaborators.
type Deps struct {
	Pool      *pgxpool.Pool
	Publisher task.Publisher // fans the timeline's events out (nil: none)
	Provider  sandbox.Provider
	CA        *pki.CA
	Canceller Canceller
	Logger    *slog.Logger
	// Getenv reads PassEnv values (os.Getenv by default).
	Getenv func(string) string
	// Traceparent returns the W3C traceparent of ctx's span ("" when none).
	Traceparent func(ctx context.Context) string
	// PullRequests closes a cancelled task's pull request (nil: a task
	// awaiting review cannot be cancelled here).
	PullRequests PullRequests
}

// PullRequests is what Dispatch does on the forge: GitHubTokenService's
// server implements it with the GitHub App's credentials.
type PullRequests interface {
	ClosePullRequest(ctx context.Context, repo string, number int, comment string) error
}

var tracer = otel.Tracer("github.com/taskrunner/taskrunner/services/dispatch")

// Server implements DispatchService and task.Dispatcher.
type Server struct {
	taskrunnerv1.UnimplementedDispatchServiceServer
	cfg   Config
	d     Deps
	tasks *task.Store
	log   *slog.Logger
	m     metrics

	starting sync.WaitGroup // sandbox starts in progress (launch)
	wake     chan struct{}  // Listen's wake-up (nil until Listen runs)
	born     time.Time      // when this server was made (the reaper's grace)
}

type metrics struct {
	latency metric.Float64Histogram
	reaper  metric.Int64Counter
}

func newMetrics(tasks *task.Store) (metrics, error) {
	meter := otel.Meter("github.com/taskrunner/taskrunner/services/dispatch")
	lat, err := meter.Float64Histogram("taskrunner.dispatch.latency", metric.WithUnit("s"),
		metric.WithDescription("Time to admit a task and create its sandbox"))
	if err != nil {
		return metrics{}, err
	}
	reaper, err := meter.Int64Counter("taskrunner.reaper.actions", metric.WithDescription("Reaper actions by kind (timeout, runner_lost, orphan)"))
	if err != nil {
		return metrics{}, err
	}
	_, err = meter.Int64ObservableGauge("taskrunner.queue.depth", metric.WithDescription("Tasks waiting in the dispatch queue"),
		metric.WithInt64Callback(func(ctx context.Context, o metric.Int64Observer) error {
			n, err := tasks.QueueDepth(ctx)
			if err != nil {
				return err
			}
			o.Observe(n)
			return nil
		}))
	return metrics{latency: lat, reaper: reaper}, err
}

var (
	_ taskrunnerv1.DispatchServiceServer = (*Server)(nil)
	_ task.Dispatcher                    = (*Server)(nil)
)

// New validates cfg and returns the service.
func New(cfg Config, d Deps) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if d.Pool == nil || d.Provider == nil || d.CA == nil {
		return nil, errors.New("dispatch: a database pool, a sandbox provider and the runner CA (TASKRUNNER_RUNNER_CA_FILE / TASKRUNNER_RUNNER_CA_KEY_FILE) are required")
	}
	if d.Logger == nil {
		d.Logger = slog.New(slog.DiscardHandler)
	}
	if d.Getenv == nil {
		d.Getenv = os.Getenv
	}
	if d.Traceparent == nil {
		d.Traceparent = func(context.Context) string { return "" }
	}
	if cfg.RunnerTokenAddr == "" {
		cfg.RunnerTokenAddr = cfg.RunnerEventsAddr
	}
	if cfg.HeartbeatInterval == 0 {
		cfg.HeartbeatInterval = 10 * time.Second // config.Daemon's default
	}
	if cfg.RunnerModelProxyAddr == "" {
		cfg.RunnerModelProxyAddr = cfg.ModelProxyAddr
	}
	tasks := task.NewStore(d.Pool)
	if d.Publisher != nil {
		tasks = tasks.WithPublisher(d.Publisher)
	}
	m, err := newMetrics(tasks)
	if err != nil {
		return nil, err
	}
	return &Server{cfg: cfg, d: d, tasks: tasks, log: d.Logger, m: m, born: time.Now()}, nil
}

// ReaperInterval is how often the reaper and the queue's safety-net drain run.
func (s *Server) ReaperInterval() time.Duration { return s.cfg.ReaperInterval }

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

// taskSpan starts a span in the task's own trace (see task.StartSpan).
func (s *Server) taskSpan(ctx context.Context, taskID, name string) (context.Context, trace.Span) {
	ctx, span := task.StartSpan(ctx, task.Task{ID: taskID, Traceparent: s.tasks.Traceparent(ctx, taskID)}, name)
	span.SetAttributes(attribute.String("taskrunner.provider", s.d.Provider.Name()))
	return ctx, span
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

// CancelTask implements task.Dispatcher. For a running task, Cancel goes
// to the runner over its stream, the runner gets CancelGrace to stop and
// report, then the sandbox is destroyed. For a task awaiting review, its
// pull request is closed with a comment naming who cancelled (through the
// PullRequests dependency: the GitHub App's credentials). The task ends
// cancelled either way, with actor on its timeline.
func (s *Server) CancelTask(ctx context.Context, taskID, reason string, actor task.Actor) (task.Task, error) {
	t, err := s.tasks.Get(ctx, taskID, "")
	if err != nil {
		return task.Task{}, err
	}
	if t.Status.Terminal() {
		return t, errs.Transition("task %s is %s: no further changes are accepted", t.ID, t.Status)
	}
	if actor == "" {
		actor = task.ActorDispatch
	}
	switch t.Status {
	case task.StatusRunning:
		if s.d.Canceller != nil {
			if err := s.d.Canceller.Cancel(ctx, taskID, reason); err != nil {
				s.log.WarnContext(ctx, "could not push Cancel to the runner", "task_id", taskID, "error", err)
			} else {
				s.waitTerminal(ctx, taskID, s.cfg.CancelGrace)
			}
		}
	case task.StatusAwaitingReview:
		if t.PRNumber > 0 {
			if s.d.PullRequests == nil {
				return task.Task{}, errs.Unavailable("cancel: the pull request cannot be closed: no GitHubToken service is configured here")
			}
			comment := fmt.Sprintf("Closed by taskrunner: task %s was cancelled by %s (%s).", t.ID, strings.TrimPrefix(string(actor), "user:"), reason)
			if err := s.d.PullRequests.ClosePullRequest(ctx, t.Repo, int(t.PRNumber), comment); err != nil {
				return task.Task{}, errs.Unavailable("cancel: could not close pull request #" + strconv.FormatInt(t.PRNumber, 10) + ": " + err.Error())
			}
		}
	}
	t, _, err = s.tasks.Advance(ctx, taskID, "", task.Advance{RequestID: "cancel", Status: task.StatusCancelled, FailedReason: reason, Actor: actor})
	if err != nil && !errors.Is(err, errs.ErrInvalidTransition) {
		return task.Task{}, err
	}
	s.destroy(context.WithoutCancel(ctx), taskID, "cancelled")
	return s.tasks.Get(ctx, taskID, "")
}

func (s *Server) waitTerminal(ctx context.Context, taskID string, grace time.Duration) {
	deadline := time.Now().Add(grace)
	for time.Now().Before(deadline) {
		t, err := s.tasks.Get(ctx, taskID, "")
		if err != nil || t.Status != task.StatusRunning {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
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

// Dispatch implements DispatchService.Dispatch (internal scope).
func (s *Server) Dispatch(ctx context.Context, req *taskrunnerv1.DispatchRequest) (*taskrunnerv1.DispatchResponse, error) {
	if _, err := auth.RequireScope(ctx, auth.ScopeInternal); err != nil {
		return nil, err
	}
	if err := task.ValidateID("task_id", req.GetTaskId()); err != nil {
		return nil, err
	}
	t, err := s.DispatchTask(ctx, req.GetTaskId())
	if err != nil {
		return nil, err
	}
	resp := &taskrunnerv1.DispatchResponse{Task: task.ToProto(t)}
	if sbs, err := s.sandboxes(ctx, t.ID, false); err == nil && len(sbs) > 0 {
		resp.Sandbox = sbs[0]
	}
	return resp, nil
}

// Cancel implements DispatchService.Cancel (internal scope).
func (s *Server) Cancel(ctx context.Context, req *taskrunnerv1.CancelRequest) (*taskrunnerv1.CancelResponse, error) {
	if _, err := auth.RequireScope(ctx, auth.ScopeInternal); err != nil {
		return nil, err
	}
	if err := task.ValidateID("task_id", req.GetTaskId()); err != nil {
		return nil, err
	}
	reason := req.GetReason()
	if reason == "" {
		reason = "cancelled"
	}
	t, err := s.CancelTask(ctx, req.GetTaskId(), reason, task.Actor(req.GetActor()))
	if err != nil {
		return nil, err
	}
	return &taskrunnerv1.CancelResponse{Task: task.ToProto(t)}, nil
}

// ListSandboxes implements DispatchService.ListSandboxes (internal scope).
func (s *Server) ListSandboxes(ctx context.Context, req *taskrunnerv1.ListSandboxesRequest) (*taskrunnerv1.ListSandboxesResponse, error) {
	if _, err := auth.RequireScope(ctx, auth.ScopeInternal); err != nil {
		return nil, err
	}
	if id := req.GetTaskId(); id != "" {
		if err := task.ValidateID("task_id", id); err != nil {
			return nil, err
		}
	}
	sbs, err := s.sandboxes(ctx, req.GetTaskId(), req.GetIncludeDestroyed())
	if err != nil {
		return nil, err
	}
	return &taskrunnerv1.ListSandboxesResponse{Sandboxes: sbs}, nil
}

func (s *Server) sandboxes(ctx context.Context, taskID string, includeDestroyed bool) ([]*taskrunnerv1.Sandbox, error) {
	rows, err := s.d.Pool.Query(ctx, `SELECT task_id::text, provider, external_id, state, created_at, destroyed_at FROM sandboxes
WHERE ($1 = '' OR task_id::text = $1) AND ($2 OR destroyed_at IS NULL) ORDER BY created_at DESC LIMIT 500`, taskID, includeDestroyed)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (*taskrunnerv1.Sandbox, error) {
		var sb taskrunnerv1.Sandbox
		var created time.Time
		var destroyed *time.Time
		if err := r.Scan(&sb.TaskId, &sb.Provider, &sb.ExternalId, &sb.State, &created, &destroyed); err != nil {
			return nil, err
		}
		sb.CreateTime = timestamppb.New(created)
		if destroyed != nil {
			sb.DestroyTime = timestamppb.New(*destroyed)
		}
		return &sb, nil
	})
}

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

// StartNextRun implements DispatchService.StartNextRun (internal scope).
func (s *Server) StartNextRun(ctx context.Context, req *taskrunnerv1.StartNextRunRequest) (*taskrunnerv1.StartNextRunResponse, error) {
	if _, err := auth.RequireScope(ctx, auth.ScopeInternal); err != nil {
		return nil, err
	}
	if err := task.ValidateID("task_id", req.GetTaskId()); err != nil {
		return nil, err
	}
	t, err := s.StartFollowUp(ctx, req.GetTaskId())
	if err != nil {
		return nil, err
	}
	return &taskrunnerv1.StartNextRunResponse{Task: task.ToProto(t)}, nil
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
