package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"

	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
	"github.com/taskrunner/taskrunner/services/auth"
	"github.com/taskrunner/taskrunner/services/config"
	"github.com/taskrunner/taskrunner/services/rpcserver"
	"github.com/taskrunner/taskrunner/services/store"
	"github.com/taskrunner/taskrunner/services/task"
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
	switch cmd {
	case "migrate":
		return migrate(ctx, cfg, logger)
	default:
		return serve(ctx, cfg, logger)
	}
}

func newLogger(cfg config.Daemon, w io.Writer) *slog.Logger {
	level, _ := config.ParseLevel(cfg.LogLevel)
	opts := &slog.HandlerOptions{Level: level}
	if cfg.LogFormat == "text" {
		return slog.New(slog.NewTextHandler(w, opts))
	}
	return slog.New(slog.NewJSONHandler(w, opts))
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

// serve runs the gRPC server until ctx ends, then drains it: health goes
// NOT_SERVING first so load balancers stop sending, then GracefulStop lets
// in-flight calls finish (bounded by the shutdown timeout).
func serve(ctx context.Context, cfg config.Daemon, logger *slog.Logger) error {
	names, _ := cfg.ServiceList()
	pool, err := store.Open(ctx, cfg.DatabaseURL)
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

	srv := rpcserver.New(rpcserver.Options{
		Logger: logger,
		Auth:   auth.NewStore(pool),
	})
	var healthNames []string
	for _, n := range names {
		switch n {
		case config.ServiceTask:
			taskrunnerv1.RegisterTaskServiceServer(srv, task.New(task.NewStore(pool), nil, logger))
			healthNames = append(healthNames, taskrunnerv1.TaskService_ServiceDesc.ServiceName)
		case config.ServiceDispatch:
			taskrunnerv1.RegisterDispatchServiceServer(srv, taskrunnerv1.UnimplementedDispatchServiceServer{})
			healthNames = append(healthNames, taskrunnerv1.DispatchService_ServiceDesc.ServiceName)
		case config.ServiceGitHubToken:
			taskrunnerv1.RegisterGitHubTokenServiceServer(srv, taskrunnerv1.UnimplementedGitHubTokenServiceServer{})
			healthNames = append(healthNames, taskrunnerv1.GitHubTokenService_ServiceDesc.ServiceName)
		case config.ServiceEvents:
			taskrunnerv1.RegisterEventsServiceServer(srv, taskrunnerv1.UnimplementedEventsServiceServer{})
			healthNames = append(healthNames, taskrunnerv1.EventsService_ServiceDesc.ServiceName)
		}
	}
	health := rpcserver.NewHealth(srv, healthNames)

	lis, err := net.Listen("tcp", cfg.GRPCAddr)
	if err != nil {
		return fmt.Errorf("TASKRUNNER_GRPC_ADDR: %w", err)
	}
	logger.Info("taskrunnerd listening", "addr", lis.Addr().String(), "services", names)

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		if err := srv.Serve(lis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			return err
		}
		return nil
	})
	g.Go(func() error {
		health.Watch(gctx, logger, 2*time.Second, func(ctx context.Context) error {
			return ping(ctx, pool, rdb)
		})
		return nil
	})
	g.Go(func() error {
		<-gctx.Done()
		logger.Info("shutting down")
		health.Shutdown()
		done := make(chan struct{})
		go func() { srv.GracefulStop(); close(done) }()
		select {
		case <-done:
		case <-time.After(cfg.ShutdownTimeout):
			logger.Warn("shutdown timeout: stopping remaining calls")
			srv.Stop()
		}
		return nil
	})
	return g.Wait()
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
