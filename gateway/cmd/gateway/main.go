package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"regexp"
	"strings"
	"syscall"
	"time"

	"github.com/caarlos0/env/v11"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"

	"github.com/taskrunner/taskrunner/gateway/config"
	"github.com/taskrunner/taskrunner/gateway/console"
	"github.com/taskrunner/taskrunner/gateway/rest"
	"github.com/taskrunner/taskrunner/gateway/sse"
	"github.com/taskrunner/taskrunner/gateway/webhook"
	"github.com/taskrunner/taskrunner/platform/rpcauth"
	"github.com/taskrunner/taskrunner/platform/telemetry"
	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
)

func main() {
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case "-h", "-help", "--help", "help":
			fmt.Print(usage)
			return
		}
		fmt.Fprintf(os.Stderr, "gateway: unexpected argument %q (configuration comes from the environment)\n\n%s", os.Args[1], usage)
		os.Exit(2)
	}
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "gateway:", err)
		os.Exit(1)
	}
}

func run() error {
	cfg, logger, err := loadConfig()
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var cl closers
	defer cl.close()
	metricsPage, err := setupTelemetry(ctx, &cl)
	if err != nil {
		return err
	}
	conns, err := dialServices(cfg, &cl)
	if err != nil {
		return err
	}
	stream, err := newSSE(cfg, conns, logger, &cl)
	if err != nil {
		return err
	}
	extra, err := browserRoutes(stream, conns)
	if err != nil {
		return err
	}
	unlimited, err := unlimitedRoutes(cfg, conns, logger, metricsPage, &cl)
	if err != nil {
		return err
	}
	var corsCfg rest.CORS // TASKRUNNER_CORS_ORIGINS; off when empty
	if err := env.Parse(&corsCfg); err != nil {
		return fmt.Errorf("configuration: %w", err)
	}
	h, err := rest.Handler(ctx, rest.Options{Task: conns.task, Events: conns.events, MaxBodyBytes: cfg.MaxBodyBytes, Logger: logger,
		Extra: extra, Unlimited: unlimited, CORS: corsCfg})
	if err != nil {
		return err
	}
	return serve(ctx, cfg, logger, h, stream)
}

// closers run last-in, first-out when run returns (what defer did when
// run was one function).
type closers []func()

func (c *closers) add(f func()) { *c = append(*c, f) }

func (c *closers) close() {
	for i := len(*c) - 1; i >= 0; i-- {
		(*c)[i]()
	}
}

// loadConfig reads and checks the configuration and makes the logger.
func loadConfig() (config.Gateway, *slog.Logger, error) {
	cfg, err := config.Load()
	if err != nil {
		return cfg, nil, err
	}
	if err := cfg.Validate(); err != nil {
		return cfg, nil, err
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(cfg.LogLevel)); err != nil {
		return cfg, nil, fmt.Errorf("TASKRUNNER_LOG_LEVEL: %w", err)
	}
	return cfg, slog.New(telemetry.Handler(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: level}))), nil
}

// setupTelemetry starts tracing and metrics; /metrics is a Prometheus text
// page over the SDK's reader: the gateway links no Prometheus client
// (platform/telemetry.MetricsPage).
func setupTelemetry(ctx context.Context, cl *closers) (*telemetry.MetricsPage, error) {
	metricsPage := telemetry.NewMetricsPage()
	tel, err := telemetry.Setup(ctx, "gateway", telemetry.WithMetricReader(metricsPage.Reader()))
	if err != nil {
		return nil, fmt.Errorf("telemetry (OTEL_* variables): %w", err)
	}
	cl.add(func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = tel.Shutdown(sctx)
	})
	return metricsPage, nil
}

// services are the gateway's connections to taskrunnerd, and the dial
// options any further connection uses.
type services struct {
	task, events *grpc.ClientConn
	dial         []grpc.DialOption
}

// dialServices opens the connections to TaskService and EventsService.
func dialServices(cfg config.Gateway, cl *closers) (services, error) {
	transport, err := transportCredentials()
	if err != nil {
		return services{}, err
	}
	// Reconnect to a restarted taskrunnerd within 1 s: gRPC's default
	// backoff (1 s growing to 120 s) left REST and /readyz failing up to
	// ~30 s after taskrunnerd listened again after a 45 s outage. Capped at
	// 800 ms with ±20 % jitter, the next attempt is at most 0.96 s away; an
	// attempt that hangs (packets dropped, not refused) gives up after 2 s
	// instead of 20 s.
	reconnect := grpc.WithConnectParams(grpc.ConnectParams{
		Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 800 * time.Millisecond},
		MinConnectTimeout: 2 * time.Second,
	})
	sv := services{dial: []grpc.DialOption{grpc.WithTransportCredentials(transport), grpc.WithStatsHandler(otelgrpc.NewClientHandler()), reconnect}}
	if sv.task, err = grpc.NewClient(cfg.TaskAddr, sv.dial...); err != nil {
		return sv, fmt.Errorf("TASKRUNNER_TASK_ADDR: %w", err)
	}
	cl.add(func() { _ = sv.task.Close() })
	sv.events = sv.task
	if cfg.EventsAddr != cfg.TaskAddr {
		events, err := grpc.NewClient(cfg.EventsAddr, sv.dial...)
		if err != nil {
			return sv, fmt.Errorf("TASKRUNNER_EVENTS_ADDR: %w", err)
		}
		sv.events = events
		cl.add(func() { _ = events.Close() })
	}
	return sv, nil
}

// newSSE starts the SSE handler on Redis. It calls the services with the
// caller's own token (never the webhook's internal one).
func newSSE(cfg config.Gateway, sv services, logger *slog.Logger, cl *closers) (*sse.Handler, error) {
	ropts, err := redis.ParseURL(cfg.RedisURL)
	if err != nil {
		return nil, fmt.Errorf("TASKRUNNER_REDIS_URL: %w", err)
	}
	rdb := redis.NewClient(ropts)
	cl.add(func() { _ = rdb.Close() })
	stream, err := sse.New(sse.Config{RedisPrefix: cfg.RedisPrefix, Heartbeat: cfg.SSEHeartbeat, ClientQueue: cfg.SSEClientQueue,
		WriteTimeout: cfg.SSEWriteTimeout, StatusInterval: cfg.SSEStatusInterval},
		taskrunnerv1.NewTaskServiceClient(sv.task), taskrunnerv1.NewEventsServiceClient(sv.events), rdb, logger)
	if err != nil {
		return nil, err
	}
	cl.add(stream.Close)
	// Open streams, subscribed channels, bytes queued, clients cut off.
	if err := stream.RegisterMetrics(otel.Meter("github.com/taskrunner/taskrunner/gateway/sse")); err != nil {
		return nil, err
	}
	return stream, nil
}

// browserRoutes are the SSE and console routes, served beside REST.
func browserRoutes(stream *sse.Handler, sv services) (map[string]http.Handler, error) {
	var consoleCfg console.Config
	if err := env.Parse(&consoleCfg); err != nil {
		return nil, fmt.Errorf("configuration: %w", err)
	}
	cons, err := console.New(consoleCfg, taskrunnerv1.NewTaskServiceClient(sv.task))
	if err != nil {
		return nil, err
	}
	extra := stream.Routes()
	for p, h := range cons.Routes() {
		extra[p] = h
	}
	return extra, nil
}

// unlimitedRoutes are mounted outside the REST body limit and CORS: the
// metrics, and the webhook, which has its own body limit (GitHub
// deliveries can exceed the API's).
func unlimitedRoutes(cfg config.Gateway, sv services, logger *slog.Logger, metricsPage http.Handler, cl *closers) (map[string]http.Handler, error) {
	unlimited := map[string]http.Handler{"GET /metrics": metricsPage}
	var whCfg webhook.Config
	if err := env.Parse(&whCfg); err != nil {
		return nil, fmt.Errorf("configuration: %w", err)
	}
	if whCfg.Secret == "" {
		logger.Warn("TASKRUNNER_GITHUB_WEBHOOK_SECRET is not set: POST " + webhook.Path + " is disabled")
		return unlimited, nil
	}
	if cfg.InternalToken == "" {
		return nil, fmt.Errorf("TASKRUNNER_GATEWAY_INTERNAL_TOKEN: required with TASKRUNNER_GITHUB_WEBHOOK_SECRET (create one with `taskctl token create --owner gateway --scopes internal`)")
	}
	whConn, err := grpc.NewClient(cfg.TaskAddr, append(sv.dial, grpc.WithPerRPCCredentials(rpcauth.BearerToken(cfg.InternalToken)))...)
	if err != nil {
		return nil, fmt.Errorf("TASKRUNNER_TASK_ADDR: %w", err)
	}
	cl.add(func() { _ = whConn.Close() })
	// Follow-ups from reviews and comments: TaskService starts them, and
	// GitHubTokenService (same address: taskrunnerd) reads GitHub.
	whTasks := taskrunnerv1.NewTaskServiceClient(whConn)
	cp := webhook.ControlPlane{Tasks: whTasks, GitHub: taskrunnerv1.NewGitHubTokenServiceClient(whConn)}
	wh, err := webhook.New(whCfg, whTasks, logger, webhook.WithFollowUps(webhook.FollowUpDeps{Runs: cp, Permissions: cp, PullRequests: cp}))
	if err != nil {
		return nil, err
	}
	unlimited["POST "+webhook.Path] = wh
	return unlimited, nil
}

// serve traces every request (one server span each, continuing the
// caller's W3C trace context; health, readiness and metrics stay out) and
// serves until ctx ends, then shuts down within the configured timeout.
func serve(ctx context.Context, cfg config.Gateway, logger *slog.Logger, h http.Handler, stream *sse.Handler) error {
	traced := otelhttp.NewHandler(namedByRoute(h), "gateway", otelhttp.WithFilter(func(r *http.Request) bool {
		switch r.URL.Path {
		case "/healthz", "/readyz", "/metrics":
			return false
		}
		return true
	}), otelhttp.WithSpanNameFormatter(func(_ string, r *http.Request) string { return spanName(r) }))
	srv := &http.Server{Handler: traced, ReadHeaderTimeout: 10 * time.Second}
	// SSE streams never go idle; end them so Shutdown need not wait them out.
	srv.RegisterOnShutdown(stream.Close)
	lis, err := net.Listen("tcp", cfg.HTTPAddr)
	if err != nil {
		return fmt.Errorf("TASKRUNNER_HTTP_ADDR: %w", err)
	}
	logger.Info("gateway listening", "addr", lis.Addr().String(), "task", cfg.TaskAddr)
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		if err := srv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	})
	g.Go(func() error {
		<-gctx.Done()
		logger.Info("shutting down")
		sctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
		defer cancel()
		return srv.Shutdown(sctx)
	})
	return g.Wait()
}

// idSegment matches a task id (a UUID) in a request path.
var idSegment = regexp.MustCompile(`[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}`)

// spanName names a request's server span by its route, never by the ids in
// its path (span names are for grouping; ids are attributes): the path with
// every task id replaced by {id}, until routing names the route template.
func spanName(r *http.Request) string {
	return r.Method + " " + idSegment.ReplaceAllString(r.URL.Path, "{id}")
}

// namedByRoute renames the request's span to the route template that
// matched (net/http's pattern, e.g. "GET /v1/tasks/{id}/events") once the
// mux has routed it.
func namedByRoute(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(w, r)
		if p := r.Pattern; p != "" && p != "/" {
			if !strings.Contains(p, " ") {
				p = r.Method + " " + p
			}
			trace.SpanFromContext(r.Context()).SetName(p)
		}
	})
}
