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
	"time"

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
	"github.com/taskrunner/taskrunner/services/store"
	"github.com/taskrunner/taskrunner/services/task"
	"github.com/taskrunner/taskrunner/services/telemetry"
)

// Canceller pushes Cancel to the runner's stream (EventsService.Cancel).
type Canceller interface {
	Cancel(ctx context.Context, taskID, reason string) error
}

// Deps are the service's collaborators.
type Deps struct {
	Pool      *pgxpool.Pool
	Provider  sandbox.Provider
	CA        *pki.CA
	Canceller Canceller
	Logger    *slog.Logger
	// Getenv reads PassEnv values (os.Getenv by default).
	Getenv func(string) string
	// Traceparent returns the W3C traceparent of ctx's span ("" when none).
	Traceparent func(ctx context.Context) string
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
}

type metrics struct {
	latency metric.Float64Histogram
	reaper  metric.Int64Counter
}

func newMetrics(pool *pgxpool.Pool) (metrics, error) {
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
			var n int64
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM tasks WHERE status = 'queued'`).Scan(&n); err != nil {
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
	m, err := newMetrics(d.Pool)
	if err != nil {
		return nil, err
	}
	return &Server{cfg: cfg, d: d, tasks: task.NewStore(d.Pool), log: d.Logger, m: m}, nil
}

// ReaperInterval is how often the reaper and the queue's safety-net drain run.
func (s *Server) ReaperInterval() time.Duration { return s.cfg.ReaperInterval }

// admissionLock serialises admission decisions across replicas; the
// decisions are short, so one transaction-scoped advisory lock is simpler
// and safer than per-repository locking.
const admissionLock = `SELECT pg_advisory_xact_lock(72610001)`

const (
	lockForAdmission = `SELECT owner, repo, status FROM tasks WHERE id = $1 FOR UPDATE`
	ownerWindow      = `SELECT count(*), min(dispatched_at) FROM tasks WHERE owner = $1 AND dispatched_at > now() - interval '24 hours'`
	runningCounts    = `SELECT count(*) FILTER (WHERE repo = $1), count(*) FROM tasks WHERE status = 'running'`
	queuedAhead      = `SELECT EXISTS (SELECT 1 FROM tasks WHERE status = 'queued' AND repo = $1)`
	markDispatched   = `UPDATE tasks SET dispatched_at = now() WHERE id = $1`
	insertSandbox    = `INSERT INTO sandboxes (task_id, provider, state) VALUES ($1, $2, 'creating')`
	markStarted      = `UPDATE tasks SET started_at = now(), deadline_at = now() + $2 * interval '1 second' WHERE id = $1 RETURNING deadline_at`
)

// admitted is a task that must be started after commit.
type admitted struct {
	id       string
	deadline time.Time
}

// DispatchTask implements task.Dispatcher: it admits the task and starts its
// sandbox, or queues it. Repeated and concurrent calls never start a second
// sandbox: the first caller moves the task out of proposing under a row lock.
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
	err = store.WithTx(ctx, s.d.Pool, pgx.ReadCommitted, func(tx pgx.Tx) error {
		start = nil
		if _, err := tx.Exec(ctx, admissionLock); err != nil {
			return err
		}
		var owner, repo, status string
		if err := tx.QueryRow(ctx, lockForAdmission, taskID).Scan(&owner, &repo, &status); err != nil {
			if errors.Is(err, pgx.ErrNoRows) {
				return errs.NotFound("task", taskID)
			}
			return err
		}
		if task.Status(status) != task.StatusProposing {
			if task.Status(status).Terminal() {
				return errs.Transition("task %s is %s: it cannot be dispatched (retry it instead)", taskID, status)
			}
			return nil // already admitted: idempotent
		}
		var n int
		var oldest *time.Time
		if err := tx.QueryRow(ctx, ownerWindow, owner).Scan(&n, &oldest); err != nil {
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
		if _, err := tx.Exec(ctx, markDispatched, taskID); err != nil {
			return err
		}
		var repoRunning, global int
		if err := tx.QueryRow(ctx, runningCounts, repo).Scan(&repoRunning, &global); err != nil {
			return err
		}
		var ahead bool
		if err := tx.QueryRow(ctx, queuedAhead, repo).Scan(&ahead); err != nil {
			return err
		}
		if ahead || repoRunning >= s.cfg.PerRepoRunning || global >= s.cfg.GlobalRunning {
			_, _, err := task.AdvanceTx(ctx, tx, taskID, "", task.Advance{RequestID: "dispatch:queue", Status: task.StatusQueued})
			return err
		}
		a, err := s.admitTx(ctx, tx, taskID)
		start = a
		return err
	})
	if err != nil {
		return task.Task{}, err
	}
	if start != nil {
		s.start(ctx, *start)
	}
	return s.tasks.Get(ctx, taskID, "")
}

// taskSpan starts a span in the task's own trace (its task.create span is
// the parent, even when this call arrives in another request), linked to
// the caller's span.
func (s *Server) taskSpan(ctx context.Context, taskID, name string) (context.Context, trace.Span) {
	var tp string
	_ = s.d.Pool.QueryRow(ctx, `SELECT traceparent FROM tasks WHERE id = $1`, taskID).Scan(&tp)
	caller := trace.SpanContextFromContext(ctx)
	parent := telemetry.ContextFromTraceparent(context.WithoutCancel(ctx), tp)
	if tp == "" {
		parent = ctx
	}
	opts := []trace.SpanStartOption{trace.WithAttributes(attribute.String("taskrunner.task_id", taskID),
		attribute.String("taskrunner.provider", s.d.Provider.Name()))}
	if caller.IsValid() && tp != "" {
		opts = append(opts, trace.WithLinks(trace.Link{SpanContext: caller}))
	}
	_, span := tracer.Start(parent, name, opts...)
	// Keep the caller's cancellation and deadline, with the task's span.
	return trace.ContextWithSpan(ctx, span), span
}

// admitTx records the sandbox and moves the task to running.
func (s *Server) admitTx(ctx context.Context, tx pgx.Tx, taskID string) (*admitted, error) {
	if _, err := tx.Exec(ctx, insertSandbox, taskID, s.d.Provider.Name()); err != nil {
		return nil, err
	}
	if _, _, err := task.AdvanceTx(ctx, tx, taskID, "", task.Advance{RequestID: "dispatch:run", Status: task.StatusRunning}); err != nil {
		return nil, err
	}
	var deadline time.Time
	if err := tx.QueryRow(ctx, markStarted, taskID, s.cfg.TaskTimeout.Seconds()).Scan(&deadline); err != nil {
		return nil, err
	}
	return &admitted{id: taskID, deadline: deadline}, nil
}

// start mints the task certificate and creates the sandbox. A failure fails
// the task (the sandbox row records it), so nothing waits for a runner that
// never started.
func (s *Server) start(ctx context.Context, a admitted) {
	ctx, span := tracer.Start(ctx, "sandbox.create", trace.WithAttributes(attribute.String("taskrunner.task_id", a.id),
		attribute.String("taskrunner.provider", s.d.Provider.Name())))
	defer span.End()
	t, err := s.tasks.Get(ctx, a.id, "")
	if err == nil {
		var sb sandbox.Sandbox
		sb, err = s.create(ctx, t, a.deadline)
		if err == nil {
			span.SetAttributes(attribute.String("taskrunner.sandbox_id", sb.ID), attribute.String("taskrunner.repo", t.Repo))
			if _, err := s.d.Pool.Exec(ctx, `UPDATE sandboxes SET external_id = $2, state = $3 WHERE task_id = $1`, a.id, sb.ID, string(sb.State)); err != nil {
				// The sandbox runs; Destroy falls back to the name derived from the task id.
				s.log.ErrorContext(ctx, "record sandbox id", "task_id", a.id, "sandbox_id", sb.ID, "error", err)
			}
			s.log.InfoContext(ctx, "sandbox created", "task_id", a.id, "provider", s.d.Provider.Name(), "sandbox_id", sb.ID)
			return
		}
	}
	span.RecordError(err)
	span.SetStatus(codes.Error, err.Error())
	s.log.ErrorContext(ctx, "sandbox create failed", "task_id", a.id, "provider", s.d.Provider.Name(), "error", err)
	_, _ = s.d.Pool.Exec(ctx, `UPDATE sandboxes SET state = 'failed', destroyed_at = now() WHERE task_id = $1`, a.id)
	if _, _, aerr := s.tasks.Advance(context.WithoutCancel(ctx), a.id, "", task.Advance{RequestID: "dispatch:start-failed",
		Status: task.StatusFailed, FailedReason: "sandbox: " + err.Error()}); aerr != nil {
		s.log.ErrorContext(ctx, "could not fail task after sandbox error", "task_id", a.id, "error", aerr)
	}
}

func (s *Server) create(ctx context.Context, t task.Task, deadline time.Time) (sandbox.Sandbox, error) {
	certPEM, keyPEM, err := s.d.CA.MintTaskCert(t.ID, deadline.Add(s.cfg.CancelGrace))
	if err != nil {
		return sandbox.Sandbox{}, fmt.Errorf("mint task certificate: %w", err)
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
	for _, k := range s.cfg.PassEnv {
		k = strings.TrimSpace(k)
		if k == "" || isGitHubSecret(k) {
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
		err := store.WithTx(ctx, s.d.Pool, pgx.ReadCommitted, func(tx pgx.Tx) error {
			start = nil
			if _, err := tx.Exec(ctx, admissionLock); err != nil {
				return err
			}
			rows, err := tx.Query(ctx, `SELECT id::text, repo FROM tasks WHERE status = 'queued' ORDER BY queued_at, id LIMIT 200`)
			if err != nil {
				return err
			}
			type q struct{ id, repo string }
			queued, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (q, error) {
				var v q
				return v, r.Scan(&v.id, &v.repo)
			})
			if err != nil || len(queued) == 0 {
				return err
			}
			running := map[string]int{}
			total := 0
			rows, err = tx.Query(ctx, `SELECT repo, count(*) FROM tasks WHERE status = 'running' GROUP BY repo`)
			if err != nil {
				return err
			}
			for rows.Next() {
				var repo string
				var n int
				if err := rows.Scan(&repo, &n); err != nil {
					rows.Close()
					return err
				}
				running[repo], total = n, total+n
			}
			rows.Close()
			if total >= s.cfg.GlobalRunning {
				return nil
			}
			for _, c := range queued {
				if running[c.repo] < s.cfg.PerRepoRunning {
					a, err := s.admitTx(ctx, tx, c.id)
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
		s.start(qctx, *start)
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
	for {
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

// CancelTask implements task.Dispatcher: Cancel goes to the runner over its
// stream, the runner gets CancelGrace to stop and report, then the sandbox
// is destroyed; the task ends cancelled either way.
func (s *Server) CancelTask(ctx context.Context, taskID, reason string) (task.Task, error) {
	t, err := s.tasks.Get(ctx, taskID, "")
	if err != nil {
		return task.Task{}, err
	}
	if t.Status.Terminal() {
		return t, errs.Transition("task %s is %s: no further changes are accepted", t.ID, t.Status)
	}
	if t.Status == task.StatusRunning && s.d.Canceller != nil {
		if err := s.d.Canceller.Cancel(ctx, taskID, reason); err != nil {
			s.log.WarnContext(ctx, "could not push Cancel to the runner", "task_id", taskID, "error", err)
		} else {
			s.waitTerminal(ctx, taskID, s.cfg.CancelGrace)
		}
	}
	t, _, err = s.tasks.Advance(ctx, taskID, "", task.Advance{RequestID: "cancel", Status: task.StatusCancelled, FailedReason: reason})
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
		if err != nil || t.Status.Terminal() {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// destroy removes the task's sandbox (idempotent) and records it.
func (s *Server) destroy(ctx context.Context, taskID, why string) {
	var ext string
	err := s.d.Pool.QueryRow(ctx, `SELECT external_id FROM sandboxes WHERE task_id = $1 AND destroyed_at IS NULL`, taskID).Scan(&ext)
	if errors.Is(err, pgx.ErrNoRows) {
		return
	}
	if err != nil {
		s.log.ErrorContext(ctx, "read sandbox", "task_id", taskID, "error", err)
		return
	}
	if ext == "" {
		ext = sandbox.Name(taskID)
	}
	if err := s.d.Provider.Destroy(ctx, ext); err != nil {
		s.log.ErrorContext(ctx, "destroy sandbox", "task_id", taskID, "sandbox_id", ext, "error", err)
		return
	}
	_, _ = s.d.Pool.Exec(ctx, `UPDATE sandboxes SET state = 'destroyed', destroyed_at = now() WHERE task_id = $1`, taskID)
	s.log.InfoContext(ctx, "sandbox destroyed", "task_id", taskID, "sandbox_id", ext, "reason", why)
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
	t, err := s.CancelTask(ctx, req.GetTaskId(), reason)
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
