package dispatch

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
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

// taskSpan starts a span in the task's own trace (see task.StartSpan).
func (s *Server) taskSpan(ctx context.Context, taskID, name string) (context.Context, trace.Span) {
	ctx, span := task.StartSpan(ctx, task.Task{ID: taskID, Traceparent: s.tasks.Traceparent(ctx, taskID)}, name)
	span.SetAttributes(attribute.String("taskrunner.provider", s.d.Provider.Name()))
	return ctx, span
}
