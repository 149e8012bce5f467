package events_test

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"

	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
	"github.com/taskrunner/taskrunner/runner/eventsclient"
	"github.com/taskrunner/taskrunner/services/auth"
	"github.com/taskrunner/taskrunner/services/events"
	"github.com/taskrunner/taskrunner/services/pki"
	"github.com/taskrunner/taskrunner/services/rpcserver"
	"github.com/taskrunner/taskrunner/services/store/storetest"
	"github.com/taskrunner/taskrunner/services/task"
)

const trustDomain = "test.taskrunner.dev"

// env is one test's PostgreSQL database, Redis key space and runner CA.
type env struct {
	db        *storetest.DB
	rds       *storetest.Redis
	ca        *pki.CA
	serverTLS *tls.Config
	tasks     *task.Store
	tokens    *auth.Store
	log       *slog.Logger
	// committers is events.Config.Committers of the replicas start serves.
	committers int
}

func newEnv(t testing.TB) *env {
	t.Helper()
	db := storetest.NewDB(t)
	rds := storetest.NewRedis(t)
	ca, err := pki.NewCA(trustDomain, 24*time.Hour)
	require.NoError(t, err)
	certPEM, keyPEM, err := ca.MintServerCert([]string{"127.0.0.1", "localhost"}, time.Hour)
	require.NoError(t, err)
	r, err := pki.NewReloaderFromSource(pki.Source{CertPEM: string(certPEM), KeyPEM: string(keyPEM), CAPEM: string(ca.CertPEM())}, nil)
	require.NoError(t, err)
	return &env{db: db, rds: rds, ca: ca, serverTLS: pki.ServerTLSConfig(r),
		tasks: task.NewStore(db.Pool), tokens: auth.NewStore(db.Pool), log: slog.New(slog.DiscardHandler)}
}

// instance is one Events replica behind a real gRPC server with mTLS.
type instance struct {
	srv  *events.Server
	addr string
	stop func()
}

// start serves an Events replica on addr ("127.0.0.1:0" for any port).
func (e *env) start(t testing.TB, addr string) *instance {
	t.Helper()
	lis, err := net.Listen("tcp", addr)
	require.NoError(t, err)
	srv, err := events.New(events.Config{TrustDomain: trustDomain, RedisPrefix: e.rds.Prefix, HeartbeatInterval: time.Second, Committers: e.committers},
		e.db.Pool, e.rds.Client, e.log)
	require.NoError(t, err)
	gs := rpcserver.New(rpcserver.Options{
		Logger:        e.log,
		Auth:          e.tokens,
		Anonymous:     map[string]bool{taskrunnerv1.EventsService_Connect_FullMethodName: true},
		ServerOptions: []grpc.ServerOption{grpc.Creds(credentials.NewTLS(e.serverTLS))},
	})
	taskrunnerv1.RegisterEventsServiceServer(gs, srv)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = gs.Serve(lis)
	}()
	var once sync.Once
	in := &instance{srv: srv, addr: lis.Addr().String()}
	in.stop = func() {
		once.Do(func() {
			srv.Close()
			gs.Stop()
			<-done
		})
	}
	t.Cleanup(in.stop)
	select {
	case <-srv.Ready():
	case <-time.After(10 * time.Second):
		t.Fatal("events server never subscribed to cancels")
	}
	return in
}

// runningTask creates a task of owner and moves it to running as Dispatch would.
func (e *env) runningTask(t testing.TB, owner string) string {
	t.Helper()
	ctx := context.Background()
	tk, _, err := e.tasks.Create(ctx, task.NewTask{Owner: owner, Repo: "acme/widgets", BaseBranch: "main", Prompt: "add a widget", Agent: task.AgentClaude}, "")
	require.NoError(t, err)
	_, err = e.db.Pool.Exec(ctx, `INSERT INTO sandboxes (task_id, provider) VALUES ($1, 'process')`, tk.ID)
	require.NoError(t, err)
	_, applied, err := e.tasks.Advance(ctx, tk.ID, "", task.Advance{Status: task.StatusRunning, RequestID: "dispatch"})
	require.NoError(t, err)
	require.True(t, applied)
	return tk.ID
}

// runnerTLS is a runner's client config with a certificate for taskID from ca.
func (e *env) runnerTLS(t testing.TB, ca *pki.CA, taskID string, notAfter time.Time) *tls.Config {
	t.Helper()
	certPEM, keyPEM, err := ca.MintTaskCert(taskID, notAfter)
	require.NoError(t, err)
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	require.NoError(t, err)
	return &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{cert}, RootCAs: e.ca.Pool(), ServerName: "127.0.0.1"}
}

// userConn is a bearer-token client connection (no client certificate).
func (e *env) userConn(t testing.TB, addr string) taskrunnerv1.EventsServiceClient {
	t.Helper()
	cc, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(credentials.NewTLS(
		&tls.Config{MinVersion: tls.VersionTLS13, RootCAs: e.ca.Pool(), ServerName: "127.0.0.1"})))
	require.NoError(t, err)
	t.Cleanup(func() { _ = cc.Close() })
	return taskrunnerv1.NewEventsServiceClient(cc)
}

// as returns ctx carrying a fresh bearer token of owner.
func (e *env) as(t testing.TB, ctx context.Context, owner string) context.Context {
	t.Helper()
	tok, _, err := e.tokens.Create(context.Background(), owner, []string{auth.ScopeTasks}, "test")
	require.NoError(t, err)
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+tok)
}

// runner is an eventsclient for taskID against addr.
func (e *env) runner(t testing.TB, addr, taskID string) *eventsclient.Client {
	t.Helper()
	c, err := eventsclient.New(eventsclient.Config{
		Addr: "passthrough:///" + addr, TLS: e.runnerTLS(t, e.ca, taskID, time.Now().Add(time.Hour)), TaskID: taskID,
		MinBackoff: 10 * time.Millisecond, MaxBackoff: 200 * time.Millisecond, Logger: e.log,
	})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	c.Start(ctx)
	t.Cleanup(func() {
		cctx, ccancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer ccancel()
		_ = c.Close(cctx)
		cancel()
	})
	return c
}

// storedSeqs returns count, distinct count, min and max seq of a task's events.
// storedSeqs summarises the runner seqs stored for a task, after checking
// that the task's whole timeline (runner and control-plane events) is one
// gap-free sequence 1..N.
func (e *env) storedSeqs(t testing.TB, taskID string) (n, distinct, lo, hi int64) {
	t.Helper()
	var all, top int64
	require.NoError(t, e.db.Pool.QueryRow(context.Background(),
		`SELECT count(*), coalesce(max(seq), 0) FROM task_events WHERE task_id = $1`, taskID).Scan(&all, &top))
	require.Equal(t, all, top, "the timeline has gaps")
	require.NoError(t, e.db.Pool.QueryRow(context.Background(),
		`SELECT count(*), count(DISTINCT runner_seq), coalesce(min(runner_seq), 0), coalesce(max(runner_seq), 0) FROM task_events WHERE task_id = $1 AND runner_seq IS NOT NULL`, taskID).
		Scan(&n, &distinct, &lo, &hi))
	return
}

// totalRows counts the runner events stored for every task.
func (e *env) totalRows(t testing.TB) int64 {
	t.Helper()
	var n int64
	require.NoError(t, e.db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM task_events WHERE runner_seq IS NOT NULL`).Scan(&n))
	return n
}

func (e *env) task(t testing.TB, id string) task.Task {
	t.Helper()
	tk, err := e.tasks.Get(context.Background(), id, "")
	require.NoError(t, err)
	return tk
}

// Event builders.
func stage(s taskrunnerv1.TaskStage) *taskrunnerv1.Event {
	return &taskrunnerv1.Event{Payload: &taskrunnerv1.Event_StageChange{StageChange: &taskrunnerv1.StageChange{Stage: s}}}
}

func logLine(line string) *taskrunnerv1.Event {
	return &taskrunnerv1.Event{Payload: &taskrunnerv1.Event_Log{Log: &taskrunnerv1.Log{Lines: []string{line}}}}
}

func diff(add, del, files int64) *taskrunnerv1.Event {
	return &taskrunnerv1.Event{Payload: &taskrunnerv1.Event_DiffStats{DiffStats: &taskrunnerv1.DiffStats{Additions: add, Deletions: del, FilesChanged: files}}}
}

func usage(cost float64, in, out int64) *taskrunnerv1.Event {
	return &taskrunnerv1.Event{Payload: &taskrunnerv1.Event_Usage{Usage: &taskrunnerv1.Usage{CostUsd: cost, TokensIn: in, TokensOut: out}}}
}

func completed(url string, n int64) *taskrunnerv1.Event {
	return &taskrunnerv1.Event{Payload: &taskrunnerv1.Event_Completed{Completed: &taskrunnerv1.Completed{PrUrl: url, PrNumber: n}}}
}

func failed(reason, url string) *taskrunnerv1.Event {
	return &taskrunnerv1.Event{Payload: &taskrunnerv1.Event_Failed{Failed: &taskrunnerv1.Failed{Reason: reason, PrUrl: url, PrNumber: 9}}}
}

// workload is n events: the four stages spread over the run, mostly log
// lines, diff stats and usage every 10th event, and last as the final one.
// It returns the events and the last diff stats sent.
func workload(n int, last *taskrunnerv1.Event) ([]*taskrunnerv1.Event, [3]int64) {
	stages := map[int]taskrunnerv1.TaskStage{
		0: taskrunnerv1.TaskStage_TASK_STAGE_EXPLORE, n / 4: taskrunnerv1.TaskStage_TASK_STAGE_PROPOSE,
		n / 2: taskrunnerv1.TaskStage_TASK_STAGE_APPLY, 3 * n / 4: taskrunnerv1.TaskStage_TASK_STAGE_ARCHIVE,
	}
	var out []*taskrunnerv1.Event
	var d [3]int64
	for i := range n - 1 {
		switch {
		case stages[i] != 0:
			out = append(out, stage(stages[i]))
		case i%10 == 3:
			d = [3]int64{int64(i * 3), int64(i), int64(i/10 + 1)}
			out = append(out, diff(d[0], d[1], d[2]))
		case i%10 == 7:
			out = append(out, usage(float64(i)/100, int64(i*1000), int64(i*100)))
		default:
			out = append(out, logLine("working on line "+string(rune('a'+i%26))))
		}
	}
	return append(out, last), d
}

// rawStream opens Connect with cfg and sends Hello for taskID; it returns
// the stream and the Welcome, or the error that ended the handshake.
func rawStream(t testing.TB, addr string, cfg *tls.Config, taskID string, version taskrunnerv1.ProtocolVersion) (grpc.BidiStreamingClient[taskrunnerv1.ConnectRequest, taskrunnerv1.ConnectResponse], *taskrunnerv1.Welcome, error) {
	t.Helper()
	cc, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	require.NoError(t, err)
	t.Cleanup(func() { _ = cc.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	stream, err := taskrunnerv1.NewEventsServiceClient(cc).Connect(ctx)
	if err != nil {
		return nil, nil, err
	}
	if err := stream.Send(&taskrunnerv1.ConnectRequest{Msg: &taskrunnerv1.ConnectRequest_Hello{Hello: &taskrunnerv1.Hello{TaskId: taskID, ProtocolVersion: version}}}); err != nil && !errors.Is(err, io.EOF) {
		return nil, nil, err
	}
	m, err := stream.Recv()
	if err != nil {
		return stream, nil, err
	}
	return stream, m.GetWelcome(), nil
}

func sendEvent(t testing.TB, stream grpc.BidiStreamingClient[taskrunnerv1.ConnectRequest, taskrunnerv1.ConnectResponse], seq int64, e *taskrunnerv1.Event) {
	t.Helper()
	e.Seq = seq
	err := stream.Send(&taskrunnerv1.ConnectRequest{Msg: &taskrunnerv1.ConnectRequest_Event{Event: e}})
	if !errors.Is(err, io.EOF) { // EOF: the server ended the stream; Recv tells why
		require.NoError(t, err)
	}
}

// proxy is a TCP relay whose connections a test can cut.
type proxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	conns  []net.Conn
	wg     sync.WaitGroup
}

func newProxy(t testing.TB, target string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &proxy{ln: ln, target: target}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", target)
			if err != nil {
				_ = c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, u)
			p.mu.Unlock()
			p.wg.Add(2)
			go func() { defer p.wg.Done(); _, _ = io.Copy(u, c); _ = u.Close() }()
			go func() { defer p.wg.Done(); _, _ = io.Copy(c, u); _ = c.Close() }()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		p.cut()
		p.wg.Wait()
	})
	return p
}

func (p *proxy) addr() string { return p.ln.Addr().String() }

// cut closes every relayed connection, as a network failure would.
func (p *proxy) cut() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := len(p.conns) / 2
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.conns = nil
	return n
}
