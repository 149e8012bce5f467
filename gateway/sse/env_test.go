package sse_test

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"

	"github.com/taskrunner/taskrunner/gateway/sse"
	"github.com/taskrunner/taskrunner/platform/eventwire"
	"github.com/taskrunner/taskrunner/platform/testkit"
	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
	"github.com/taskrunner/taskrunner/services/auth"
	"github.com/taskrunner/taskrunner/services/events"
	"github.com/taskrunner/taskrunner/services/pki"
	"github.com/taskrunner/taskrunner/services/rpcserver"
	"github.com/taskrunner/taskrunner/services/store/storetest"
	"github.com/taskrunner/taskrunner/services/task"
)

const trustDomain = "test.taskrunner.dev"

// env is one test's PostgreSQL database and Redis key space, TaskService and
// EventsService behind a real gRPC server on loopback (TLS, since runners
// authenticate with client certificates), and the SSE handler behind
// httptest, dialing those services as the gateway does.
type env struct {
	db     *storetest.DB
	rds    *storetest.Redis
	ca     *pki.CA
	tasks  *task.Store // publishes what it appends, after the commit
	quiet  *task.Store // appends without publishing (a lost message)
	tokens *auth.Store
	addr   string           // gRPC
	cc     *grpc.ClientConn // the gateway's connection to the services
	calls  *callCounter     // the gateway's calls on cc, by method
	h      *sse.Handler
	srv    *httptest.Server
}

type envOptions struct {
	// smallSendBuffer shrinks the kernel send buffer of the HTTP server's
	// connections so that a client that stops reading blocks the writer
	// after a few kilobytes instead of a few megabytes.
	smallSendBuffer bool
	// http2 serves HTTP/2 over TLS (its streams cannot be taken over).
	http2 bool
}

func newEnv(t *testing.T, cfg sse.Config, o envOptions) *env {
	t.Helper()
	log := slog.New(slog.DiscardHandler)
	db := storetest.NewDB(t)
	rds := storetest.NewRedis(t)
	ca, err := pki.NewCA(trustDomain, 24*time.Hour)
	require.NoError(t, err)
	certPEM, keyPEM, err := ca.MintServerCert([]string{"127.0.0.1", "localhost"}, time.Hour)
	require.NoError(t, err)
	rl, err := pki.NewReloaderFromSource(pki.Source{CertPEM: string(certPEM), KeyPEM: string(keyPEM), CAPEM: string(ca.CertPEM())}, nil)
	require.NoError(t, err)
	quiet := task.NewStore(db.Pool)
	e := &env{db: db, rds: rds, ca: ca, quiet: quiet, tasks: quiet.WithPublisher(task.NewRedisPublisher(rds.Client, rds.Prefix, log)),
		tokens: auth.NewStore(db.Pool)}

	// The services.
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	evs, err := events.New(events.Config{TrustDomain: trustDomain, RedisPrefix: rds.Prefix, HeartbeatInterval: time.Second}, db.Pool, rds.Client, log)
	require.NoError(t, err)
	gs := rpcserver.New(rpcserver.Options{
		Logger: log, Auth: e.tokens,
		Anonymous:     map[string]bool{taskrunnerv1.EventsService_Connect_FullMethodName: true},
		ServerOptions: []grpc.ServerOption{grpc.Creds(credentials.NewTLS(pki.ServerTLSConfig(rl)))},
	})
	taskrunnerv1.RegisterTaskServiceServer(gs, task.New(e.tasks, nil, log))
	taskrunnerv1.RegisterEventsServiceServer(gs, evs)
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = gs.Serve(lis)
	}()
	t.Cleanup(func() {
		evs.Close()
		gs.Stop()
		<-served
	})
	e.addr = lis.Addr().String()

	// The gateway side: a plain client connection, no database.
	e.calls = &callCounter{n: map[string]int{}}
	cc, err := grpc.NewClient("passthrough:///"+e.addr, grpc.WithTransportCredentials(credentials.NewTLS(
		&tls.Config{MinVersion: tls.VersionTLS13, RootCAs: ca.Pool(), ServerName: "127.0.0.1"})),
		grpc.WithUnaryInterceptor(e.calls.intercept))
	require.NoError(t, err)
	t.Cleanup(func() { _ = cc.Close() })
	e.cc = cc
	cfg.RedisPrefix = rds.Prefix
	e.h, err = sse.New(cfg, taskrunnerv1.NewTaskServiceClient(cc), taskrunnerv1.NewEventsServiceClient(cc), rds.Client, log)
	require.NoError(t, err)
	t.Cleanup(e.h.Close)

	e.srv = httptest.NewUnstartedServer(e.h)
	if o.smallSendBuffer {
		e.srv.Listener = smallBufListener{e.srv.Listener}
	}
	if o.http2 {
		e.srv.EnableHTTP2 = true
		e.srv.StartTLS()
	} else {
		e.srv.Start()
	}
	t.Cleanup(e.srv.Close)
	return e
}

// callCounter counts the unary calls made on a connection, by method.
type callCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *callCounter) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	c.mu.Lock()
	c.n[method]++
	c.mu.Unlock()
	return invoker(ctx, method, req, reply, cc, opts...)
}

func (c *callCounter) get(method string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[method]
}

type smallBufListener struct{ net.Listener }

func (l smallBufListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetWriteBuffer(4096)
	}
	return c, err
}

// token is a fresh bearer token of owner.
func (e *env) token(t *testing.T, owner string) string {
	t.Helper()
	tok, _, err := e.tokens.Create(context.Background(), owner, []string{auth.ScopeTasks}, "test")
	require.NoError(t, err)
	return tok
}

// newTask creates a task of owner (status proposing, repo acme/widgets, base main).
func (e *env) newTask(t *testing.T, owner string) string {
	t.Helper()
	tk, _, err := e.tasks.Create(context.Background(), task.NewTask{Owner: owner, Repo: "acme/widgets", BaseBranch: "main", Prompt: "add a widget", Agent: task.AgentClaude}, "")
	require.NoError(t, err)
	return tk.ID
}

// runningTask creates a task of owner and moves it to running as Dispatch would.
func (e *env) runningTask(t *testing.T, owner string) string {
	t.Helper()
	id := e.newTask(t, owner)
	e.dispatched(t, id)
	e.advance(t, id, task.Advance{Status: task.StatusRunning, Actor: task.ActorDispatch})
	return id
}

// appendTo appends evs to the task's timeline through package task, the
// one writer of timelines, as the control plane does (each at the next seq,
// which it sets on evs), and returns evs. With publish their messages go
// out after the commit, as in production; without, they are stored only,
// as if their messages were lost.
func (e *env) appendTo(t *testing.T, id string, publish bool, evs ...*taskrunnerv1.Event) []*taskrunnerv1.Event {
	t.Helper()
	st := e.quiet
	if publish {
		st = e.tasks
	}
	ctx := context.Background()
	require.NoError(t, st.InTx(ctx, func(tx *task.Tx) error {
		if _, err := tx.Lock(ctx, id); err != nil {
			return err
		}
		var last int64
		if err := tx.QueryRow(ctx, `SELECT coalesce(max(seq), 0) FROM task_events WHERE task_id = $1`, id).Scan(&last); err != nil {
			return err
		}
		for i, ev := range evs {
			if err := tx.Append(ctx, id, ev); err != nil {
				return err
			}
			ev.Seq = last + int64(i) + 1
		}
		return nil
	}))
	return evs
}

// emit appends and publishes evs (see appendTo).
func (e *env) emit(t *testing.T, id string, evs ...*taskrunnerv1.Event) []*taskrunnerv1.Event {
	t.Helper()
	return e.appendTo(t, id, true, evs...)
}

// publish sends stored events on the task's channel again, as a duplicate
// or late message would arrive.
func (e *env) publish(t *testing.T, id string, evs ...*taskrunnerv1.Event) {
	t.Helper()
	for _, ev := range evs {
		b, err := eventwire.EncodeEvent(ev)
		require.NoError(t, err)
		msg := eventwire.EncodeMessage(ev.GetSeq(), eventwire.TypeName(ev), eventwire.Final(ev), b)
		require.NoError(t, e.rds.Client.Publish(context.Background(), eventwire.Channel(e.rds.Prefix, id), msg).Err())
	}
}

// advance moves the task as the named actor would (the status_change is
// appended and published after the commit).
func (e *env) advance(t *testing.T, id string, a task.Advance) {
	t.Helper()
	if a.RequestID == "" {
		a.RequestID = string(a.Actor) + ":" + string(a.Status)
	}
	_, applied, err := e.tasks.Advance(context.Background(), id, "", a)
	require.NoError(t, err)
	require.True(t, applied)
}

// timeline is the task's stored timeline.
func (e *env) timeline(t *testing.T, id string) []*taskrunnerv1.Event {
	t.Helper()
	recs, err := events.NewStore(e.db.Pool).ListAfter(context.Background(), id, 0, 10000)
	require.NoError(t, err)
	out := make([]*taskrunnerv1.Event, 0, len(recs))
	for i, r := range recs {
		ev, err := eventwire.DecodeEvent(r.Payload)
		require.NoError(t, err)
		require.Equal(t, int64(i+1), ev.GetSeq(), "the stored timeline has no gap")
		out = append(out, ev)
	}
	return out
}

// runner is a minimal runner on the real Connect stream with a task
// certificate (mTLS): the path events take in production.
type runner struct {
	stream grpc.BidiStreamingClient[taskrunnerv1.ConnectRequest, taskrunnerv1.ConnectResponse]
}

func (e *env) runner(t *testing.T, id string) *runner {
	t.Helper()
	certPEM, keyPEM, err := e.ca.MintTaskCert(id, time.Now().Add(time.Hour))
	require.NoError(t, err)
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	require.NoError(t, err)
	cc, err := grpc.NewClient("passthrough:///"+e.addr, grpc.WithTransportCredentials(credentials.NewTLS(
		&tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{cert}, RootCAs: e.ca.Pool(), ServerName: "127.0.0.1"})))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() {
		cancel()
		_ = cc.Close()
	})
	stream, err := taskrunnerv1.NewEventsServiceClient(cc).Connect(ctx)
	require.NoError(t, err)
	require.NoError(t, stream.Send(&taskrunnerv1.ConnectRequest{Msg: &taskrunnerv1.ConnectRequest_Hello{Hello: &taskrunnerv1.Hello{
		TaskId: id, ProtocolVersion: taskrunnerv1.ProtocolVersion_PROTOCOL_VERSION_1}}}))
	m, err := stream.Recv()
	require.NoError(t, err)
	require.NotNil(t, m.GetWelcome())
	return &runner{stream: stream}
}

// send streams evs (their seqs set) and waits until the last is acknowledged.
func (r *runner) send(t *testing.T, evs ...*taskrunnerv1.Event) {
	t.Helper()
	for _, ev := range evs {
		require.NoError(t, r.stream.Send(&taskrunnerv1.ConnectRequest{Msg: &taskrunnerv1.ConnectRequest_Event{Event: ev}}))
	}
	want := evs[len(evs)-1].GetSeq()
	for {
		m, err := r.stream.Recv()
		require.NoError(t, err)
		if m.GetAck() != nil && m.GetAck().GetSeq() >= want {
			return
		}
	}
}

// msg is one SSE message or comment as a client sees it.
type msg struct {
	id      int64
	event   string
	data    string
	hasData bool
	retry   string
	comment string
}

// client is an SSE connection read by the test.
type client struct {
	resp *http.Response
	rd   *testkit.SSEReader
}

// request builds a GET for path with an optional token and Last-Event-ID.
func (e *env) request(t *testing.T, ctx context.Context, path, token string, hdr map[string]string) *http.Request {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, e.srv.URL+path, nil)
	require.NoError(t, err)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	return req
}

// open connects and reads up to the retry hint: from then on the stream's
// Redis subscription is confirmed, so anything published is seen.
func (e *env) open(t *testing.T, path, token string, hdr map[string]string) *client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	resp, err := e.srv.Client().Do(e.request(t, ctx, path, token, hdr))
	require.NoError(t, err)
	t.Cleanup(func() { _ = resp.Body.Close() })
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
	require.Equal(t, "no-cache", resp.Header.Get("Cache-Control"))
	require.Equal(t, "no", resp.Header.Get("X-Accel-Buffering"))
	c := newClient(resp)
	first, err := c.next()
	require.NoError(t, err)
	require.NotEmpty(t, first.retry, "the stream starts with a retry hint")
	return c
}

// status connects and returns the HTTP status of a request that must not
// open a stream, checking that its body is empty.
func (e *env) status(t *testing.T, path, token string, hdr map[string]string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := e.srv.Client().Do(e.request(t, ctx, path, token, hdr))
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	if resp.StatusCode == http.StatusNoContent {
		require.Empty(t, body)
	}
	return resp.StatusCode
}

// rest reads the raw stream to its end, without heartbeat comments.
func (c *client) rest(t *testing.T) string {
	t.Helper()
	b, err := c.rd.Rest()
	require.NoError(t, err)
	return strings.ReplaceAll(string(b), ": ping\n\n", "")
}

// newClient reads resp as an SSE stream.
func newClient(resp *http.Response) *client {
	return &client{resp: resp, rd: testkit.NewSSEReader(resp.Body)}
}

// taskStatus is the task's status in the database.
func (e *env) taskStatus(t *testing.T, id string) taskrunnerv1.TaskStatus {
	t.Helper()
	tk, err := e.tasks.Get(context.Background(), id, "")
	require.NoError(t, err)
	return task.ToProto(tk).GetStatus()
}

// next reads one message or comment (platform/testkit's SSE reader).
func (c *client) next() (msg, error) {
	m, err := c.rd.Next()
	if err != nil {
		return msg{}, err
	}
	out := msg{event: m.Event, data: m.Data, hasData: m.HasData, retry: m.Retry, comment: m.Comment}
	if m.HasID {
		if out.id, err = strconv.ParseInt(m.ID, 10, 64); err != nil {
			return out, err
		}
	}
	return out, nil
}

// events reads messages (skipping comments) until the server ends the
// stream, failing on anything that is not a clean end.
func (c *client) events(t *testing.T) []msg {
	t.Helper()
	var out []msg
	for {
		m, err := c.next()
		if errors.Is(err, io.EOF) {
			return out
		}
		require.NoError(t, err)
		if m.comment == "" {
			out = append(out, m)
		}
	}
}

// take reads exactly n messages, skipping comments.
func (c *client) take(t *testing.T, n int) []msg {
	t.Helper()
	var out []msg
	for len(out) < n {
		m, err := c.next()
		require.NoError(t, err)
		if m.comment == "" {
			out = append(out, m)
		}
	}
	return out
}

func ids(ms []msg) []int64 {
	out := make([]int64, 0, len(ms))
	for _, m := range ms {
		out = append(out, m.id)
	}
	return out
}

func seqRange(from, to int64) []int64 {
	var out []int64
	for i := from; i <= to; i++ {
		out = append(out, i)
	}
	return out
}

// Event builders; seq is set by the caller through at.
func at(seq int64, ev *taskrunnerv1.Event) *taskrunnerv1.Event { ev.Seq = seq; return ev }

func stage(s taskrunnerv1.TaskStage) *taskrunnerv1.Event {
	return &taskrunnerv1.Event{Payload: &taskrunnerv1.Event_StageChange{StageChange: &taskrunnerv1.StageChange{Stage: s}}}
}

func logLine(line string) *taskrunnerv1.Event {
	return &taskrunnerv1.Event{Payload: &taskrunnerv1.Event_Log{Log: &taskrunnerv1.Log{Lines: []string{line}}}}
}

func diff(add, del, files int64) *taskrunnerv1.Event {
	return &taskrunnerv1.Event{Payload: &taskrunnerv1.Event_DiffStats{DiffStats: &taskrunnerv1.DiffStats{Additions: add, Deletions: del, FilesChanged: files}}}
}

func completed(url string, n int64) *taskrunnerv1.Event {
	return &taskrunnerv1.Event{Payload: &taskrunnerv1.Event_Completed{Completed: &taskrunnerv1.Completed{PrUrl: url, PrNumber: n}}}
}

func failed(reason string) *taskrunnerv1.Event {
	return &taskrunnerv1.Event{Payload: &taskrunnerv1.Event_Failed{Failed: &taskrunnerv1.Failed{Reason: reason}}}
}

func cancelled(reason string) *taskrunnerv1.Event {
	return &taskrunnerv1.Event{Payload: &taskrunnerv1.Event_Cancelled{Cancelled: &taskrunnerv1.Cancelled{Reason: reason}}}
}

// logs is n log events with seqs from, from+1, …
func logs(from int64, n int) []*taskrunnerv1.Event {
	out := make([]*taskrunnerv1.Event, 0, n)
	for i := range n {
		out = append(out, at(from+int64(i), logLine("line "+strconv.Itoa(int(from)+i))))
	}
	return out
}

func usage(cost float64) *taskrunnerv1.Event {
	return &taskrunnerv1.Event{Payload: &taskrunnerv1.Event_Usage{Usage: &taskrunnerv1.Usage{CostUsd: cost, TokensIn: 10, TokensOut: 20}}}
}

func queuePos(n int64) *taskrunnerv1.Event {
	return &taskrunnerv1.Event{Payload: &taskrunnerv1.Event_QueuePosition{QueuePosition: &taskrunnerv1.QueuePosition{Position: n}}}
}

func sandboxState(state string) *taskrunnerv1.Event {
	return &taskrunnerv1.Event{Payload: &taskrunnerv1.Event_Sandbox{Sandbox: &taskrunnerv1.SandboxState{State: state, Provider: "process"}}}
}

// withSeqs returns copies of evs numbered 1, 2, 3 … (runner seqs).
func withSeqs(evs ...*taskrunnerv1.Event) []*taskrunnerv1.Event {
	for i, ev := range evs {
		ev.Seq = int64(i + 1)
	}
	return evs
}

// cancelTask cancels through TaskService with the owner's token, as a user does.
func (e *env) cancelTask(t *testing.T, id, tok, reason string) {
	t.Helper()
	ctx := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+tok)
	_, err := taskrunnerv1.NewTaskServiceClient(e.cc).CancelTask(ctx, &taskrunnerv1.CancelTaskRequest{Id: id, Reason: reason})
	require.NoError(t, err)
}

// dispatched records a sandbox so the task may move to running.
func (e *env) dispatched(t *testing.T, id string) {
	t.Helper()
	_, err := e.db.Pool.Exec(context.Background(), `INSERT INTO sandboxes (task_id, provider) VALUES ($1, 'process')`, id)
	require.NoError(t, err)
}
