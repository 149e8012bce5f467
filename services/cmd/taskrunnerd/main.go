package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/exaring/otelpgx"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/extra/redisotel/v9"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"

	ptel "github.com/taskrunner/taskrunner/platform/telemetry"
	"github.com/taskrunner/taskrunner/services/config"
	"github.com/taskrunner/taskrunner/services/store"
	"github.com/taskrunner/taskrunner/services/task"
	"github.com/taskrunner/taskrunner/services/telemetry"
)

const usage = `usage: taskrunnerd [serve] [--services=task,dispatch,githubtoken,events|all]
       taskrunnerd migrate

Configuration comes from TASKRUNNER_* environment variables (see README.md).
`

func main() {
	if err := run(os.Args[1:], os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "taskrunnerd:", err)
		os.Exit(1)
	}
}

func run(args []string, stderr io.Writer) error {
	cmd := "serve"
	if len(args) > 0 && (args[0] == "serve" || args[0] == "migrate") {
		cmd, args = args[0], args[1:]
	}
	fs := flag.NewFlagSet("taskrunnerd", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, usage); fs.PrintDefaults() }
	services := fs.String("services", "", "services to serve (overrides TASKRUNNER_SERVICES)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil // usage printed; help is not a failure
		}
		return err
	}
	cfg, err := config.Load()
	if err != nil {
		return err
	}
	if *services != "" {
		cfg.Services = *services
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	logger := newLogger(cfg, stderr)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	tel, err := telemetry.Setup(ctx, "taskrunnerd")
	if err != nil {
		return fmt.Errorf("telemetry (OTEL_* variables): %w", err)
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = tel.Shutdown(sctx)
	}()
	switch cmd {
	case "migrate":
		return migrate(ctx, cfg, logger)
	default:
		return serve(ctx, cfg, logger, tel)
	}
}

func newLogger(cfg config.Daemon, w io.Writer) *slog.Logger {
	level, _ := config.ParseLevel(cfg.LogLevel)
	opts := &slog.HandlerOptions{Level: level}
	if cfg.LogFormat == "text" {
		return slog.New(ptel.Handler(slog.NewTextHandler(w, opts)))
	}
	return slog.New(ptel.Handler(slog.NewJSONHandler(w, opts)))
}

func migrate(ctx context.Context, cfg config.Daemon, logger *slog.Logger) error {
	pool, err := store.Open(ctx, cfg.DatabaseURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	v, err := store.Migrate(ctx, pool, logger)
	if err != nil {
		return err
	}
	logger.Info("schema up to date", "version", v)
	return nil
}

// serve runs the gRPC servers until ctx ends, then drains them: health goes
// NOT_SERVING first so load balancers stop sending, runner streams are told
// to reconnect elsewhere, then GracefulStop lets in-flight calls finish
// (bounded by the shutdown timeout).
func serve(ctx context.Context, cfg config.Daemon, logger *slog.Logger, tel *telemetry.Telemetry) error {
	pcfg, err := pgxpool.ParseConfig(cfg.DatabaseURL)
	if err != nil {
		return fmt.Errorf("TASKRUNNER_DATABASE_URL: %w", err)
	}
	pcfg.ConnConfig.Tracer = otelpgx.NewTracer(otelpgx.WithTracerProvider(ptel.ChildOnly(tel.Tracer)))
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	ropts, err := redis.ParseURL(cfg.RedisURL)
	if err != nil {
		return fmt.Errorf("TASKRUNNER_REDIS_URL: %w", err)
	}
	rdb := redis.NewClient(ropts)
	defer rdb.Close()
	if err := redisotel.InstrumentTracing(rdb, redisotel.WithTracerProvider(ptel.ChildOnly(tel.Tracer))); err != nil {
		return err
	}
	if err := taskMetrics(pool); err != nil {
		return err
	}

	a, err := assemble(ctx, cfg, pool, rdb, logger)
	if err != nil {
		return err
	}
	defer a.close()

	lis, err := net.Listen("tcp", cfg.GRPCAddr)
	if err != nil {
		return fmt.Errorf("TASKRUNNER_GRPC_ADDR: %w", err)
	}
	logger.Info("taskrunnerd listening", "addr", lis.Addr().String(), "services", a.names)
	var runnerLis net.Listener
	if a.runner != nil {
		if runnerLis, err = net.Listen("tcp", cfg.RunnerGRPCAddr); err != nil {
			return fmt.Errorf("TASKRUNNER_RUNNER_GRPC_ADDR: %w", err)
		}
		logger.Info("runner port listening (mTLS)", "addr", runnerLis.Addr().String())
	}

	g, gctx := errgroup.WithContext(ctx)
	if cfg.MetricsAddr != "" {
		mlis, err := net.Listen("tcp", cfg.MetricsAddr)
		if err != nil {
			return fmt.Errorf("TASKRUNNER_METRICS_ADDR: %w", err)
		}
		msrv := &http.Server{Handler: metricsMux(tel), ReadHeaderTimeout: 5 * time.Second}
		g.Go(func() error {
			if err := msrv.Serve(mlis); err != nil && !errors.Is(err, http.ErrServerClosed) {
				return err
			}
			return nil
		})
		g.Go(func() error { <-gctx.Done(); return msrv.Close() })
		logger.Info("metrics listening", "addr", mlis.Addr().String(), "path", "/metrics")
	}
	serveOn := func(srv *grpc.Server, l net.Listener) func() error {
		return func() error {
			if err := srv.Serve(l); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
				return err
			}
			return nil
		}
	}
	g.Go(serveOn(a.public, lis))
	if a.runner != nil {
		g.Go(serveOn(a.runner, runnerLis))
	}
	g.Go(func() error {
		a.health.Watch(gctx, logger, 2*time.Second, func(ctx context.Context) error {
			return ping(ctx, pool, rdb)
		})
		return nil
	})
	for _, bg := range a.background {
		g.Go(func() error { bg(gctx); return nil })
	}
	g.Go(func() error {
		<-gctx.Done()
		logger.Info("shutting down")
		a.health.Shutdown()
		if a.runnerHealth != nil {
			a.runnerHealth.Shutdown()
		}
		if a.events != nil {
			a.events.Close()
		}
		done := make(chan struct{})
		go func() {
			if a.runner != nil {
				a.runner.GracefulStop()
			}
			a.public.GracefulStop()
			close(done)
		}()
		select {
		case <-done:
		case <-time.After(cfg.ShutdownTimeout):
			logger.Warn("shutdown timeout: stopping remaining calls")
			if a.runner != nil {
				a.runner.Stop()
			}
			a.public.Stop()
		}
		return nil
	})
	return g.Wait()
}

func metricsMux(tel *telemetry.Telemetry) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", tel.Metrics)
	return mux
}

// taskMetrics publishes the number of tasks in each status, read at scrape time.
func taskMetrics(pool *pgxpool.Pool) error {
	tasks := task.NewStore(pool)
	_, err := otel.Meter("github.com/taskrunner/taskrunner/services/task").Int64ObservableGauge("taskrunner.tasks",
		metric.WithDescription("Tasks by status"),
		metric.WithInt64Callback(func(ctx context.Context, o metric.Int64Observer) error {
			counts, err := tasks.CountByStatus(ctx)
			if err != nil {
				return err
			}
			for st, n := range counts {
				o.Observe(n, metric.WithAttributes(attribute.String("status", string(st))))
			}
			return nil
		}))
	return err
}

func ping(ctx context.Context, pool *pgxpool.Pool, rdb *redis.Client) error {
	if err := pool.Ping(ctx); err != nil {
		return fmt.Errorf("postgresql: %w", err)
	}
	if err := rdb.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("redis: %w", err)
	}
	return nil
}
