// Command gateway serves taskrunner's public REST API (grpc-gateway), health,
// readiness and the OpenAPI document, dialing the gRPC services. It is the
// only place that reads signals.
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
	"syscall"
	"time"

	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/taskrunner/taskrunner/gateway/config"
	"github.com/taskrunner/taskrunner/gateway/rest"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "gateway:", err)
		os.Exit(1)
	}
}

func run() error {
	cfg, err := config.Load()
	if err != nil {
		return err
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(cfg.LogLevel)); err != nil {
		return fmt.Errorf("TASKRUNNER_LOG_LEVEL: %w", err)
	}
	logger := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	taskConn, err := grpc.NewClient(cfg.TaskAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("TASKRUNNER_TASK_ADDR: %w", err)
	}
	defer taskConn.Close()
	eventsConn := taskConn
	if cfg.EventsAddr != cfg.TaskAddr {
		if eventsConn, err = grpc.NewClient(cfg.EventsAddr, grpc.WithTransportCredentials(insecure.NewCredentials())); err != nil {
			return fmt.Errorf("TASKRUNNER_EVENTS_ADDR: %w", err)
		}
		defer eventsConn.Close()
	}
	h, err := rest.Handler(ctx, rest.Options{Task: taskConn, Events: eventsConn, MaxBodyBytes: cfg.MaxBodyBytes, Logger: logger})
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
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
