// Command devstack is the local stack launcher behind `make run` and
// `make test`: `devstack deps` makes sure PostgreSQL and Redis answer
// (starting throwaway servers under .dev/ when they do not) and prints their
// URLs as shell exports; `devstack up` runs the whole stack until Ctrl-C.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/taskrunner/taskrunner/services/auth"
	"github.com/taskrunner/taskrunner/services/store"
	"github.com/taskrunner/taskrunner/tools/devstack"
)

func main() {
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: devstack deps|up [flags]")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	switch os.Args[1] {
	case "deps":
		err = deps(ctx, os.Args[2:], logger)
	case "up":
		err = up(ctx, os.Args[2:], logger)
	default:
		err = fmt.Errorf("unknown command %q (want deps or up)", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "devstack:", err)
		os.Exit(1)
	}
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// deps prints `export` lines for the test suite; servers it starts keep
// running (they live in .dev/ and on non-standard ports).
func deps(ctx context.Context, args []string, logger *slog.Logger) error {
	fs := flag.NewFlagSet("deps", flag.ContinueOnError)
	dir := fs.String("dev-dir", ".dev", "state directory")
	if err := fs.Parse(args); err != nil {
		return err
	}
	o := devstack.Options{Dir: *dir, AllowInstall: true, Logger: logger}
	pg, err := devstack.EnsurePostgres(ctx, envOr("TEST_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"), o)
	if err != nil {
		return err
	}
	rd, err := devstack.EnsureRedis(ctx, envOr("TEST_REDIS_URL", "redis://127.0.0.1:6379/0"), o)
	if err != nil {
		return err
	}
	fmt.Printf("export TEST_DATABASE_URL=%q\nexport TEST_REDIS_URL=%q\n", pg.URL, rd.URL)
	return nil
}

type stack struct {
	procs  []*devstack.Proc
	deps   []*devstack.Dep
	logger *slog.Logger
}

func (s *stack) stop() {
	for i := len(s.procs) - 1; i >= 0; i-- {
		p := s.procs[i]
		if err := p.Stop(15 * time.Second); err != nil && !strings.Contains(err.Error(), "signal: terminated") {
			s.logger.Warn("stopped with error", "process", p.Name, "error", err)
		}
	}
	for i := len(s.deps) - 1; i >= 0; i-- {
		s.deps[i].Stop()
	}
}

func up(ctx context.Context, args []string, logger *slog.Logger) error {
	fs := flag.NewFlagSet("up", flag.ContinueOnError)
	dir := fs.String("dev-dir", ".dev", "state directory")
	binDir := fs.String("bin-dir", ".dev/bin", "where make put the binaries")
	if err := fs.Parse(args); err != nil {
		return err
	}
	httpAddr := envOr("TASKRUNNER_HTTP_ADDR", "127.0.0.1:8080")
	grpcAddr := envOr("TASKRUNNER_GRPC_ADDR", "127.0.0.1:7070")
	logDir := filepath.Join(*dir, "logs")
	o := devstack.Options{Dir: *dir, AllowInstall: true, Logger: logger}
	s := &stack{logger: logger}
	defer s.stop()

	pg, err := devstack.EnsurePostgres(ctx, envOr("TASKRUNNER_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/taskrunner?sslmode=disable"), o)
	if err != nil {
		return err
	}
	s.deps = append(s.deps, pg)
	rd, err := devstack.EnsureRedis(ctx, envOr("TASKRUNNER_REDIS_URL", "redis://127.0.0.1:6379/0"), o)
	if err != nil {
		return err
	}
	s.deps = append(s.deps, rd)
	env := []string{
		"TASKRUNNER_DATABASE_URL=" + pg.URL,
		"TASKRUNNER_REDIS_URL=" + rd.URL,
		"TASKRUNNER_GRPC_ADDR=" + grpcAddr,
		"TASKRUNNER_HTTP_ADDR=" + httpAddr,
		"TASKRUNNER_TASK_ADDR=" + grpcAddr,
		"TASKRUNNER_EVENTS_ADDR=" + grpcAddr,
	}
	bin := func(n string) string { p, _ := filepath.Abs(filepath.Join(*binDir, n)); return p }

	migrate := exec.CommandContext(ctx, bin("taskrunnerd"), "migrate")
	migrate.Env = append(os.Environ(), env...)
	if out, err := migrate.CombinedOutput(); err != nil {
		return fmt.Errorf("taskrunnerd migrate: %w\n%s", err, out)
	}

	daemon, err := devstack.Start("taskrunnerd", logDir, bin("taskrunnerd"), []string{"--services=all"}, env)
	if err != nil {
		return err
	}
	s.procs = append(s.procs, daemon)
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	if err := daemon.WaitReady(ctx, 60*time.Second, func(ctx context.Context) error {
		r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{})
		if err == nil && r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			err = errors.New(r.GetStatus().String())
		}
		return err
	}); err != nil {
		return err
	}

	gw, err := devstack.Start("gateway", logDir, bin("gateway"), nil, env)
	if err != nil {
		return err
	}
	s.procs = append(s.procs, gw)
	if err := gw.WaitReady(ctx, 30*time.Second, func(ctx context.Context) error {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+httpAddr+"/readyz", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("readyz: %s", resp.Status)
		}
		return nil
	}); err != nil {
		return err
	}

	token, err := devToken(ctx, pg.URL, filepath.Join(*dir, "token"))
	if err != nil {
		return err
	}
	printBanner(httpAddr, grpcAddr, token, logDir)

	select {
	case <-ctx.Done():
		logger.Info("stopping the stack")
		return nil
	case <-daemon.Done():
		return fmt.Errorf("taskrunnerd exited: %v (log: %s)", daemon.Err(), daemon.LogPath)
	case <-gw.Done():
		return fmt.Errorf("gateway exited: %v (log: %s)", gw.Err(), gw.LogPath)
	}
}

// devToken reuses the token saved by an earlier run when it still works,
// and otherwise creates one for owner "dev".
func devToken(ctx context.Context, dbURL, path string) (string, error) {
	pool, err := store.Open(ctx, dbURL)
	if err != nil {
		return "", err
	}
	defer pool.Close()
	tokens := auth.NewStore(pool)
	if b, err := os.ReadFile(path); err == nil {
		tok := strings.TrimSpace(string(b))
		if _, err := tokens.Authenticate(ctx, tok); err == nil {
			return tok, nil
		}
	}
	tok, _, err := tokens.Create(ctx, "dev", nil, "make run")
	if err != nil {
		return "", err
	}
	return tok, os.WriteFile(path, []byte(tok+"\n"), 0o600)
}

func printBanner(httpAddr, grpcAddr, token, logDir string) {
	fmt.Printf(`
taskrunner is up.

  REST API     http://%[1]s/v1/tasks        (OpenAPI: http://%[1]s/openapi.json)
  gRPC         %[2]s                   (taskctl --addr %[2]s)
  logs         %[4]s/
  token        %[3]s     (owner "dev"; also in .dev/token)

Create a task:

  curl -s -X POST http://%[1]s/v1/tasks \
    -H 'Authorization: Bearer %[3]s' -H 'Content-Type: application/json' \
    -d '{"repo":"demo/greet","prompt":"Add a --farewell flag to greet"}'

List tasks over gRPC:

  TASKRUNNER_TOKEN=%[3]s go run ./tools/cmd/taskctl task list

Press Ctrl-C to stop everything this command started.
`, httpAddr, grpcAddr, token, logDir)
}
