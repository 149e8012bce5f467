package rest_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/taskrunner/taskrunner/gateway/rest"
	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
	"github.com/taskrunner/taskrunner/services/auth"
	"github.com/taskrunner/taskrunner/services/rpcserver"
	"github.com/taskrunner/taskrunner/services/store/storetest"
	"github.com/taskrunner/taskrunner/services/task"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/jackc/pgx/v5/pgxpool.(*Pool).backgroundHealthCheck"))
}

type env struct {
	server *rest.Server
	db     *storetest.DB
	url    string
	tokens map[string]string
	health *rpcserver.Health
}

func newEnv(t *testing.T, configure ...func(*rest.Options, *grpc.ClientConn)) *env {
	t.Helper()
	db := storetest.NewDB(t)
	lg := slog.New(slog.DiscardHandler)
	tokens := auth.NewStore(db.Pool)
	srv := rpcserver.New(rpcserver.Options{Logger: lg, Auth: tokens})
	taskrunnerv1.RegisterTaskServiceServer(srv, task.New(task.NewStore(db.Pool), nil, lg))
	health := rpcserver.NewHealth(srv, []string{taskrunnerv1.TaskService_ServiceDesc.ServiceName})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = srv.Serve(lis) }()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	o := rest.Options{Task: conn, Events: conn, MaxBodyBytes: 64 << 10, Logger: lg}
	for _, c := range configure {
		c(&o, conn)
	}
	h, err := rest.Handler(ctx, o)
	require.NoError(t, err)
	hs := httptest.NewServer(h)
	t.Cleanup(func() { hs.Close(); cancel(); _ = conn.Close(); srv.Stop() })
	e := &env{server: h.(*rest.Server), db: db, url: hs.URL, tokens: map[string]string{}, health: health}
	for _, o := range []string{"alice", "bob"} {
		tok, _, err := tokens.Create(context.Background(), o, nil, "")
		require.NoError(t, err)
		e.tokens[o] = tok
	}
	return e
}

type reply struct {
	status int
	header http.Header
	body   map[string]any
	raw    string
}

func (e *env) do(t *testing.T, method, path, owner, body string, hdr ...string) reply {
	t.Helper()
	req, err := http.NewRequest(method, e.url+path, strings.NewReader(body))
	require.NoError(t, err)
	if owner != "" {
		req.Header.Set("Authorization", "Bearer "+e.tokens[owner])
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	r := reply{status: resp.StatusCode, header: resp.Header, raw: string(b)}
	_ = json.Unmarshal(b, &r.body)
	return r
}

func (e *env) rows(t *testing.T) int {
	var n int
	require.NoError(t, e.db.Pool.QueryRow(context.Background(), "SELECT count(*) FROM tasks").Scan(&n))
	return n
}

func TestCreateGetListOverREST(t *testing.T) {
	e := newEnv(t)
	r := e.do(t, "POST", "/v1/tasks", "alice", `{"repo":"acme/widgets","prompt":"Add a farewell flag"}`)
	require.Equal(t, http.StatusOK, r.status, r.raw)
	tk := r.body["task"].(map[string]any)
	require.Equal(t, "TASK_STATUS_PROPOSING", tk["status"])
	require.Equal(t, "main", tk["base_branch"])
	require.NotEmpty(t, r.header.Get("X-Request-Id"))
	for k := range r.header {
		require.False(t, strings.HasPrefix(k, "Grpc"), "internal header %s leaked into a 2xx", k)
	}
	id := tk["id"].(string)

	r = e.do(t, "GET", "/v1/tasks/"+id, "alice", "")
	require.Equal(t, http.StatusOK, r.status, r.raw)
	require.Equal(t, id, r.body["task"].(map[string]any)["id"])
	require.Len(t, r.body["task"].(map[string]any)["runs"], 1, "the full view by default")
	r = e.do(t, "GET", "/v1/tasks/"+id+"?view=TASK_VIEW_BASIC", "alice", "")
	require.Equal(t, http.StatusOK, r.status, r.raw)
	require.Equal(t, "TASK_STATUS_PROPOSING", r.body["task"].(map[string]any)["status"])
	require.Empty(t, r.body["task"].(map[string]any)["runs"], "the basic view has no runs")

	r = e.do(t, "GET", "/v1/tasks?status=proposing", "alice", "")
	require.Equal(t, http.StatusOK, r.status, r.raw)
	require.Len(t, r.body["tasks"], 1)
	r = e.do(t, "GET", "/v1/tasks?status=running&repo=acme/widgets", "alice", "")
	require.Equal(t, http.StatusOK, r.status, r.raw)
	require.Empty(t, r.body["tasks"])

	r = e.do(t, "GET", "/v1/tasks/"+id, "bob", "")
	require.Equal(t, http.StatusNotFound, r.status, r.raw)
	require.EqualValues(t, 5, r.body["code"])
	require.Contains(t, r.body["message"], "not found")

	// A request id the caller sends comes back.
	r = e.do(t, "GET", "/v1/tasks/"+id, "alice", "", "X-Request-Id", "abc123")
	require.Equal(t, "abc123", r.header.Get("X-Request-Id"))

	r = e.do(t, "POST", "/v1/tasks/"+id+":cancel", "alice", `{}`)
	require.Equal(t, http.StatusOK, r.status, r.raw)
	require.Equal(t, "TASK_STATUS_CANCELLED", r.body["task"].(map[string]any)["status"])
	r = e.do(t, "POST", "/v1/tasks/"+id+":retry", "alice", `{}`)
	require.Equal(t, http.StatusOK, r.status, r.raw)
	require.Equal(t, id, r.body["task"].(map[string]any)["retry_of"])
}

func TestBadRequestsOverREST(t *testing.T) {
	e := newEnv(t)
	cases := []struct {
		name, method, path, body string
		status                   int
		contains                 string
	}{
		{"missing prompt", "POST", "/v1/tasks", `{"repo":"a/b"}`, 400, "prompt:"},
		{"empty prompt", "POST", "/v1/tasks", `{"repo":"a/b","prompt":""}`, 400, "prompt:"},
		{"prompt over 32 KiB", "POST", "/v1/tasks", `{"repo":"a/b","prompt":"` + strings.Repeat("x", 33<<10) + `"}`, 400, "prompt:"},
		{"bad repo", "POST", "/v1/tasks", `{"repo":"not a repo","prompt":"p"}`, 400, "repo:"},
		{"bad branch", "POST", "/v1/tasks", `{"repo":"a/b","prompt":"p","base_branch":"x~1"}`, 400, "base_branch:"},
		{"unknown agent", "POST", "/v1/tasks", `{"repo":"a/b","prompt":"p","agent":"AGENT_GPT"}`, 400, "agent"},
		{"unknown field", "POST", "/v1/tasks", `{"repository":"a/b","prompt":"p"}`, 400, "repository"},
		{"malformed json", "POST", "/v1/tasks", `{"repo":`, 400, ""},
		{"body over limit", "POST", "/v1/tasks", `{"repo":"a/b","prompt":"` + strings.Repeat("x", 70<<10) + `"}`, 413, "limit"},
		{"malformed id", "GET", "/v1/tasks/xyz", "", 400, "id:"},
		{"unknown status filter", "GET", "/v1/tasks?status=sleeping", "", 400, "status:"},
		{"internal rpc not routed", "POST", "/v1/tasks/00000000-0000-0000-0000-000000000000:advance", `{}`, 404, "no route"},
		{"internal path absent", "POST", "/v1/tasks:advance", `{}`, 404, "no route"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := e.do(t, tc.method, tc.path, "alice", tc.body)
			require.Equal(t, tc.status, r.status, r.raw)
			require.Contains(t, r.body, "code", r.raw)
			require.Contains(t, r.body, "message", r.raw)
			require.Contains(t, r.body["message"], tc.contains)
			require.Zero(t, e.rows(t), "a rejected request writes nothing")
		})
	}
	r := e.do(t, "POST", "/v1/tasks", "", `{"repo":"a/b","prompt":"p"}`)
	require.Equal(t, http.StatusUnauthorized, r.status, r.raw)
	require.Equal(t, `Bearer realm="taskrunner"`, r.header.Get("WWW-Authenticate"))
	require.Empty(t, r.header.Values("Grpcgateway-Content-Type"))
	r = e.do(t, "GET", "/v1/tasks", "", "", "Authorization", "Bearer trt_wrongwrongwrongwrongwrong")
	require.Equal(t, http.StatusUnauthorized, r.status, r.raw)
	require.Zero(t, e.rows(t))
}

func TestIdempotencyKeyHeader(t *testing.T) {
	e := newEnv(t)
	var wg sync.WaitGroup
	ids := make(chan string, 20)
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := e.do(t, "POST", "/v1/tasks", "alice", `{"repo":"acme/widgets","prompt":"once"}`, "Idempotency-Key", "k-42")
			if r.status == http.StatusOK {
				ids <- r.body["task"].(map[string]any)["id"].(string)
			}
		}()
	}
	wg.Wait()
	close(ids)
	var first string
	n := 0
	for id := range ids {
		if first == "" {
			first = id
		}
		require.Equal(t, first, id)
		n++
	}
	require.Equal(t, 20, n)
	require.Equal(t, 1, e.rows(t))
}

func TestHealthReadyOpenAPI(t *testing.T) {
	e := newEnv(t)
	require.Equal(t, http.StatusOK, e.do(t, "GET", "/healthz", "", "").status)
	require.Equal(t, http.StatusServiceUnavailable, e.do(t, "GET", "/readyz", "", "").status, "NOT_SERVING until dependencies answer")
	e.health.Set(true)
	require.Equal(t, http.StatusOK, e.do(t, "GET", "/readyz", "", "").status)
	r := e.do(t, "GET", "/openapi.json", "", "")
	require.Equal(t, http.StatusOK, r.status)
	paths := r.body["paths"].(map[string]any)
	require.Contains(t, paths, "/v1/tasks")
	require.Contains(t, paths, "/v1/tasks/{id}:dispatch")
	for _, internal := range []string{"TaskService_AdvanceTask", "DispatchService_", "GitHubTokenService_", "EventsService_Connect", "EventsService_Subscribe"} {
		require.NotContains(t, r.raw, internal, "internal RPCs are not in the public API")
	}
}
