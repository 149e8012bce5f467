package bench

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/taskrunner/taskrunner/gateway/sse"
	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
	"github.com/taskrunner/taskrunner/services/auth"
	"github.com/taskrunner/taskrunner/services/events"
	"github.com/taskrunner/taskrunner/services/pki"
	"github.com/taskrunner/taskrunner/services/rpcserver"
	"github.com/taskrunner/taskrunner/services/store"
	"github.com/taskrunner/taskrunner/services/task"
)

// Default server addresses, the same as the test suite's.
const (
	DefaultDatabaseURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
	DefaultRedisURL    = "redis://127.0.0.1:6379/0"
	trustDomain        = "bench.taskrunner.dev"
	benchOwner         = "bench"
)

// DatabaseURL is the admin URL the benchmark creates its database through:
// TASKRUNNER_BENCH_DATABASE_URL, else TEST_DATABASE_URL, else the default.
func DatabaseURL() string {
	return firstEnv(DefaultDatabaseURL, "TASKRUNNER_BENCH_DATABASE_URL", "TEST_DATABASE_URL")
}

// RedisURL is the Redis the benchmark uses: TASKRUNNER_BENCH_REDIS_URL,
// else TEST_REDIS_URL, else the default.
func RedisURL() string {
	return firstEnv(DefaultRedisURL, "TASKRUNNER_BENCH_REDIS_URL", "TEST_REDIS_URL")
}

func firstEnv(def string, names ...string) string {
	for _, n := range names {
		if v := os.Getenv(n); v != "" {
			return v
		}
	}
	return def
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// Env is everything both designs run against, in this process: a database
// of its own, a Redis key prefix of its own, the runner CA, the Events and
// Task services behind one mTLS gRPC listener, the gateway's SSE handler
// on a real HTTP listener, and the baseline's HTTPS callback receiver.
type Env struct {
	log *slog.Logger

	adminURL string
	dbName   string
	Pool     *pgxpool.Pool // services (Events, Task, auth)
	basePool *pgxpool.Pool // the baseline's handler: one connection per runner
	Redis    *redis.Client
	Prefix   string

	// SynchronousCommit and Fsync are the database's settings, as SHOW
	// reports them.
	SynchronousCommit, Fsync string

	CA       *pki.CA
	tasks    *task.Store
	Token    string // bearer token of benchOwner, for SSE clients
	GRPCAddr string // Task + Events, mTLS for runners
	SSEURL   string // http://127.0.0.1:port
	BaseAddr string // the baseline's HTTPS receiver
	baseTLS  *tls.Config
	Baseline *BaselineServer
	sse      *sse.Handler // the gateway's SSE handler, for its open-stream gauge
	rounds   rounds       // its writers' rounds (taskrunner.sse.round_duration)
	// Committers is the Events service's number of group committers.
	Committers int
	closeFns   []func()

	clientCmd []string
}

// EnvOptions size the pools.
type EnvOptions struct {
	// BaselineConns is the baseline handler's pool size: the old design
	// held one connection per concurrent callback.
	BaselineConns int
	Logger        *slog.Logger
	// MaxBatch and MaxBatchDelay override the Events service's group
	// commit settings (zero keeps its defaults).
	MaxBatch      int
	MaxBatchDelay time.Duration
	Committers    int
	// ClientCommand starts the client process of each scenario: a program
	// that calls RunClient (bench-events runs itself with -client).
	ClientCommand []string
}

// NewEnv creates the database and starts every server. Close undoes it.
func NewEnv(ctx context.Context, o EnvOptions) (_ *Env, err error) {
	e := &Env{log: o.Logger, clientCmd: o.ClientCommand, adminURL: DatabaseURL(), dbName: "taskrunner_bench_" + randomHex(6), Prefix: "taskrunner_bench_" + randomHex(6) + ":"}
	defer func() {
		if err != nil {
			e.Close()
		}
	}()
	if err := e.createDB(ctx, o.BaselineConns); err != nil {
		return nil, err
	}
	ropts, err := redis.ParseURL(RedisURL())
	if err != nil {
		return nil, fmt.Errorf("bench: redis url: %w", err)
	}
	ropts.PoolSize = 64
	e.Redis = redis.NewClient(ropts)
	e.closeFns = append(e.closeFns, func() { e.cleanRedis(); _ = e.Redis.Close() })
	if err := e.Redis.Ping(ctx).Err(); err != nil {
		return nil, fmt.Errorf("bench: redis at %s: %w", RedisURL(), err)
	}
	if err := e.startServices(ctx, o); err != nil {
		return nil, err
	}
	if err := e.startBaseline(); err != nil {
		return nil, err
	}
	return e, nil
}

func withDatabase(admin, name string) (string, error) {
	u, err := url.Parse(admin)
	if err != nil {
		return "", fmt.Errorf("bench: database url: %w", err)
	}
	u.Path = "/" + name
	return u.String(), nil
}

func withPoolSize(dbURL string, n int) string {
	u, _ := url.Parse(dbURL)
	q := u.Query()
	q.Set("pool_max_conns", fmt.Sprint(n))
	u.RawQuery = q.Encode()
	return u.String()
}

func (e *Env) createDB(ctx context.Context, baseConns int) error {
	conn, err := pgx.Connect(ctx, e.adminURL)
	if err != nil {
		return fmt.Errorf("bench: PostgreSQL at %s: %w", e.adminURL, err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{e.dbName}.Sanitize()); err != nil {
		return fmt.Errorf("bench: create database: %w", err)
	}
	e.closeFns = append(e.closeFns, e.dropDB)
	dbURL, err := withDatabase(e.adminURL, e.dbName)
	if err != nil {
		return err
	}
	if e.Pool, err = store.Open(ctx, withPoolSize(dbURL, 16)); err != nil {
		return err
	}
	if e.basePool, err = store.Open(ctx, withPoolSize(dbURL, max(baseConns, 4))); err != nil {
		return err
	}
	e.closeFns = append(e.closeFns, e.Pool.Close, e.basePool.Close)
	if _, err := store.Migrate(ctx, e.Pool, slog.New(slog.DiscardHandler)); err != nil {
		return err
	}
	// Both designs must pay for durable commits: refuse to measure otherwise.
	if err := e.Pool.QueryRow(ctx, "SHOW synchronous_commit").Scan(&e.SynchronousCommit); err != nil {
		return err
	}
	if err := e.Pool.QueryRow(ctx, "SHOW fsync").Scan(&e.Fsync); err != nil {
		return err
	}
	if e.SynchronousCommit != "on" {
		return fmt.Errorf("bench: synchronous_commit is %q; both designs must be measured with it on", e.SynchronousCommit)
	}
	return nil
}

func (e *Env) dropDB() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, e.adminURL)
	if err != nil {
		e.log.Warn("bench: could not drop the database", "database", e.dbName, "error", err)
		return
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{e.dbName}.Sanitize()+" WITH (FORCE)"); err != nil {
		e.log.Warn("bench: could not drop the database", "database", e.dbName, "error", err)
	}
}

// cleanRedis deletes keys under the prefix (pub/sub leaves none today; this
// keeps the promise if that changes).
func (e *Env) cleanRedis() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	it := e.Redis.Scan(ctx, 0, e.Prefix+"*", 1000).Iterator()
	for it.Next(ctx) {
		_ = e.Redis.Del(ctx, it.Val()).Err()
	}
}

// Close stops every server and drops the database, in reverse order.
func (e *Env) Close() {
	for i := len(e.closeFns) - 1; i >= 0; i-- {
		e.closeFns[i]()
	}
	e.closeFns = nil
}

func (e *Env) startServices(ctx context.Context, o EnvOptions) error {
	ca, err := pki.NewCA(trustDomain, 24*time.Hour)
	if err != nil {
		return err
	}
	e.CA = ca
	certPEM, keyPEM, err := ca.MintServerCert([]string{"127.0.0.1", "localhost"}, 24*time.Hour)
	if err != nil {
		return err
	}
	rl, err := pki.NewReloaderFromSource(pki.Source{CertPEM: string(certPEM), KeyPEM: string(keyPEM), CAPEM: string(ca.CertPEM())}, e.log)
	if err != nil {
		return err
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return err
	}
	e.baseTLS = &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{cert}, NextProtos: []string{"http/1.1"}}

	e.tasks = task.NewStore(e.Pool)
	tokens := auth.NewStore(e.Pool)
	if e.Token, _, err = tokens.Create(ctx, benchOwner, []string{auth.ScopeTasks}, "bench-events"); err != nil {
		return err
	}

	evs, err := events.New(events.Config{TrustDomain: trustDomain, RedisPrefix: e.Prefix,
		MaxBatch: o.MaxBatch, MaxBatchDelay: o.MaxBatchDelay, Committers: o.Committers}, e.Pool, e.Redis, e.log)
	if err != nil {
		return err
	}
	e.Committers = evs.Committers()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		evs.Close()
		return err
	}
	gs := rpcserver.New(rpcserver.Options{
		Logger: e.log, Auth: tokens,
		Anonymous:     map[string]bool{taskrunnerv1.EventsService_Connect_FullMethodName: true},
		ServerOptions: append(events.ServerOptions(), grpc.Creds(credentials.NewTLS(pki.ServerTLSConfig(rl)))),
	})
	taskrunnerv1.RegisterTaskServiceServer(gs, task.New(e.tasks, nil, e.log))
	taskrunnerv1.RegisterEventsServiceServer(gs, evs)
	served := make(chan struct{})
	go func() { defer close(served); _ = gs.Serve(lis) }()
	e.closeFns = append(e.closeFns, func() { evs.Close(); gs.Stop(); <-served })
	e.GRPCAddr = lis.Addr().String()
	select {
	case <-evs.Ready():
	case <-time.After(10 * time.Second):
		return errors.New("bench: the events server never subscribed to Redis")
	}

	// The gateway: a plain TLS client of the services (bearer tokens, no
	// client certificate) and the real SSE handler on a real listener.
	cc, err := grpc.NewClient("passthrough:///"+e.GRPCAddr, grpc.WithTransportCredentials(credentials.NewTLS(
		&tls.Config{MinVersion: tls.VersionTLS13, RootCAs: ca.Pool(), ServerName: "127.0.0.1"})))
	if err != nil {
		return err
	}
	e.closeFns = append(e.closeFns, func() { _ = cc.Close() })
	h, err := sse.New(sse.Config{RedisPrefix: e.Prefix}, taskrunnerv1.NewTaskServiceClient(cc), taskrunnerv1.NewEventsServiceClient(cc), e.Redis, e.log)
	if err != nil {
		return err
	}
	e.sse = h
	mp, rs := newRoundsProvider()
	if err := h.RegisterMetrics(mp.Meter("github.com/taskrunner/taskrunner/tools/bench")); err != nil {
		h.Close()
		return err
	}
	e.rounds = rs
	e.closeFns = append(e.closeFns, func() { _ = mp.Shutdown(context.Background()) })
	hl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		h.Close()
		return err
	}
	hs := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	hs.RegisterOnShutdown(h.Close)
	go func() { _ = hs.Serve(hl) }()
	e.closeFns = append(e.closeFns, func() {
		h.Close()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = hs.Shutdown(sctx)
	})
	e.SSEURL = "http://" + hl.Addr().String()
	return nil
}

// runningTasks creates n tasks of benchOwner and moves them to running as
// Dispatch does (a sandbox row, then AdvanceTask), so stage events apply.
func (e *Env) runningTasks(ctx context.Context, n int) ([]string, error) {
	ids := make([]string, n)
	for i := range ids {
		tk, _, err := e.tasks.Create(ctx, task.NewTask{Owner: benchOwner, Repo: "acme/widgets", BaseBranch: "main",
			Prompt: "benchmark the event path", Agent: task.AgentClaude}, "")
		if err != nil {
			return nil, err
		}
		if _, err := e.Pool.Exec(ctx, `INSERT INTO sandboxes (task_id, provider) VALUES ($1, 'process')`, tk.ID); err != nil {
			return nil, err
		}
		if _, _, err := e.tasks.Advance(ctx, tk.ID, "", task.Advance{Status: task.StatusRunning, RequestID: "dispatch"}); err != nil {
			return nil, err
		}
		ids[i] = tk.ID
	}
	return ids, nil
}

// DBName is the benchmark's own database.
func (e *Env) DBName() string { return e.dbName }

// CommitLatency times n sequential single-row autocommit inserts into a
// table of the benchmark's database: the cost of one durable commit on this
// host right now, the floor under both designs' latency.
func (e *Env) CommitLatency(ctx context.Context, n int) (Latencies, error) {
	if _, err := e.Pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS bench_commit_probe (id bigserial PRIMARY KEY, at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return Latencies{}, err
	}
	d := make([]time.Duration, 0, n)
	for range n {
		t0 := time.Now()
		if _, err := e.Pool.Exec(ctx, `INSERT INTO bench_commit_probe DEFAULT VALUES`); err != nil {
			return Latencies{}, err
		}
		d = append(d, time.Since(t0))
	}
	return Summarise(d), nil
}
