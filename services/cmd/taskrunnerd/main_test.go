package main

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"

	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
	"github.com/taskrunner/taskrunner/services/auth"
	"github.com/taskrunner/taskrunner/services/pki"
	"github.com/taskrunner/taskrunner/services/store/storetest"
)

func buildDaemon(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "taskrunnerd")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, string(out))
	return bin
}

func freeAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().String()
}

func TestConfigErrorsNameTheVariable(t *testing.T) {
	bin := buildDaemon(t)
	cases := map[string]string{
		"TASKRUNNER_DATABASE_URL":      "mysql://x",
		"TASKRUNNER_GRPC_ADDR":         "nonsense",
		"TASKRUNNER_SERVICES":          "task,billing",
		"TASKRUNNER_LOG_LEVEL":         "loud",
		"TASKRUNNER_EVENTS_COMMITTERS": "0",
		// One liveness setting for Events' Welcome and the reaper, in whole
		// seconds because runners are told it in seconds.
		"TASKRUNNER_HEARTBEAT_INTERVAL": "1500ms",
	}
	for name, val := range cases {
		t.Run(name, func(t *testing.T) {
			cmd := exec.Command(bin)
			cmd.Env = append(os.Environ(), name+"="+val)
			out, err := cmd.CombinedOutput()
			require.Error(t, err)
			require.Contains(t, string(out), name, string(out))
		})
	}
	// A provider that cannot work with its settings fails at start.
	cmd := exec.Command(bin, "--services=dispatch")
	ca := t.TempDir()
	_, perr := pki.InitDev(ca, "taskrunner.local", nil)
	require.NoError(t, perr)
	db := storetest.NewDB(t)
	cmd.Env = append(os.Environ(), "TASKRUNNER_SANDBOX_PROVIDER=fly", "TASKRUNNER_DATABASE_URL="+db.URL,
		"TASKRUNNER_RUNNER_CA_FILE="+filepath.Join(ca, "ca.pem"), "TASKRUNNER_RUNNER_CA_KEY_FILE="+filepath.Join(ca, "ca-key.pem"))
	out, err := cmd.CombinedOutput()
	require.Error(t, err)
	require.Contains(t, string(out), "TASKRUNNER_FLY_", string(out))
	require.Contains(t, string(out), "App", string(out))

	out, err = exec.Command(bin, "--services=nope").CombinedOutput()
	require.Error(t, err)
	require.Contains(t, string(out), "TASKRUNNER_SERVICES")
}

// TestSIGTERMDrainsInFlightRequests holds a CreateTask inside PostgreSQL
// (the tasks table is locked), sends SIGTERM, and shows that the process
// keeps the call alive, answers it once the lock is released, and exits 0.
func TestSIGTERMDrainsInFlightRequests(t *testing.T) {
	db := storetest.NewDB(t)
	rd := storetest.NewRedis(t)
	bin := buildDaemon(t)
	addr := freeAddr(t)
	ctx := context.Background()

	migrate := exec.Command(bin, "migrate")
	migrate.Env = append(os.Environ(), "TASKRUNNER_DATABASE_URL="+db.URL, "TASKRUNNER_REDIS_URL="+rd.URL)
	out, err := migrate.CombinedOutput()
	require.NoError(t, err, string(out))
	require.Contains(t, string(out), "schema up to date")

	cmd := exec.Command(bin, "--services=task")
	logs := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = logs, logs
	cmd.Env = append(os.Environ(), "TASKRUNNER_DATABASE_URL="+db.URL, "TASKRUNNER_REDIS_URL="+rd.URL, "TASKRUNNER_GRPC_ADDR="+addr,
		"TASKRUNNER_METRICS_ADDR=127.0.0.1:0")
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() { _ = cmd.Process.Kill() })

	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	require.Eventually(t, func() bool {
		r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: taskrunnerv1.TaskService_ServiceDesc.ServiceName})
		return err == nil && r.GetStatus() == healthpb.HealthCheckResponse_SERVING
	}, 20*time.Second, 50*time.Millisecond, "never became SERVING: %s", logs)

	tok, _, err := auth.NewStore(db.Pool).Create(ctx, "alice", nil, "")
	require.NoError(t, err)
	client := taskrunnerv1.NewTaskServiceClient(conn)
	actx := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+tok)

	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "LOCK TABLE tasks IN ACCESS EXCLUSIVE MODE")
	require.NoError(t, err)

	type result struct {
		task *taskrunnerv1.Task
		err  error
	}
	done := make(chan result, 1)
	go func() {
		r, err := client.CreateTask(actx, &taskrunnerv1.CreateTaskRequest{Repo: "acme/widgets", Prompt: "in flight"})
		done <- result{r.GetTask(), err}
	}()
	// Wait until the call is blocked on the lock inside PostgreSQL.
	require.Eventually(t, func() bool {
		var n int
		_ = db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND wait_event_type = 'Lock'`, db.Name).Scan(&n)
		return n > 0
	}, 10*time.Second, 20*time.Millisecond)

	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "shutting down") }, 10*time.Second, 20*time.Millisecond)
	select {
	case err := <-exited:
		t.Fatalf("exited before the in-flight call finished: %v\n%s", err, logs)
	case r := <-done:
		t.Fatalf("call finished while the table was locked: %+v", r)
	default:
	}
	require.NoError(t, tx.Rollback(ctx))

	select {
	case r := <-done:
		require.NoError(t, r.err)
		require.Equal(t, "in flight", r.task.GetPrompt())
	case <-time.After(10 * time.Second):
		t.Fatal("in-flight call never completed")
	}
	select {
	case err := <-exited:
		require.NoError(t, err, "exit status must be 0:\n%s", logs)
	case <-time.After(30 * time.Second):
		t.Fatalf("process did not exit after SIGTERM:\n%s", logs)
	}
	var n int
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT count(*) FROM tasks").Scan(&n))
	require.Equal(t, 1, n, "the in-flight create was committed")
}

type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
