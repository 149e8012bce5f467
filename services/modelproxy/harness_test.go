package modelproxy_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/taskrunner/taskrunner/services/modelproxy"
	"github.com/taskrunner/taskrunner/services/pki"
	"github.com/taskrunner/taskrunner/services/store/storetest"
	"github.com/taskrunner/taskrunner/services/task"
	"github.com/taskrunner/taskrunner/tools/modelapi"
)

// Keys: the real ones live in the proxy's configuration; the sandbox's is what a CLI sends.
const (
	anthropicKey = "sk-ant-api03-real-key-0123456789abcdefghij"
	openAIKey    = "sk-proj-real-openai-key-0123456789abcdef"
	sandboxKey   = "sandbox-dummy-key"
	trustDomain  = "taskrunner.test"
)

// script answers any prompt starting with "hello" with one text turn and fixed usage per API
// call, which the tests compare with what the proxy records.
const script = `
stages:
  - name: hello
    match: '^hello'
    usage: {input_tokens: 1200, output_tokens: 300, cached_input_tokens: 200}
    turns:
      - - text: "Hello from the scripted model."
`

// Usage the script reports per call, and its price under testPrices.
const (
	scriptIn, scriptOut = 1200, 300
	testModel           = "claude-test-model"
	testOpenAIModel     = "gpt-test-model"
)

// testPrices: USD per million tokens. Anthropic calls cost 1200*10/1e6 + 300*20/1e6 =
// 0.018; Responses calls (200 of the 1200 input tokens cached) 1000*10/1e6 + 200*1/1e6 +
// 300*20/1e6 = 0.0162.
const testPrices = `{"claude-test": {"input": 10, "output": 20, "cache_read": 1}, "gpt-test": {"input": 10, "output": 20, "cache_read": 1}}`

const (
	anthropicCallCost = 0.018
	openAICallCost    = 0.0162
)

// seen records the credentials the upstream received.
type seen struct {
	mu      sync.Mutex
	apiKeys []string
	auths   []string
}

func (s *seen) get() (apiKeys, auths []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.apiKeys...), append([]string(nil), s.auths...)
}

type harness struct {
	t        *testing.T
	db       *storetest.DB
	tasks    *task.Store
	ca       *pki.CA
	api      *modelapi.Server
	upstream *httptest.Server
	seen     *seen
	proxy    *httptest.Server
	logs     *syncBuffer
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
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

// newHarness starts the scripted model API (the real upstream of these tests) and the proxy
// on an mTLS listener that requires a certificate of the runner CA, as taskrunnerd does.
func newHarness(t *testing.T, maxBudget float64) *harness {
	t.Helper()
	h := &harness{t: t, db: storetest.NewDB(t), seen: &seen{}, logs: &syncBuffer{}}
	h.tasks = task.NewStore(h.db.Pool)
	sc, err := modelapi.ParseScript([]byte(script))
	require.NoError(t, err)
	h.api = modelapi.New(sc, slog.New(slog.DiscardHandler))
	h.upstream = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.seen.mu.Lock()
		h.seen.apiKeys = append(h.seen.apiKeys, r.Header.Get("X-Api-Key"))
		h.seen.auths = append(h.seen.auths, r.Header.Get("Authorization"))
		h.seen.mu.Unlock()
		h.api.ServeHTTP(w, r)
	}))
	t.Cleanup(h.upstream.Close)

	h.ca, err = pki.NewCA(trustDomain, time.Hour)
	require.NoError(t, err)
	logger := slog.New(slog.NewJSONHandler(h.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	srv, err := modelproxy.New(modelproxy.Config{
		AnthropicUpstream: h.upstream.URL, OpenAIUpstream: h.upstream.URL,
		AnthropicKey: anthropicKey, OpenAIKey: openAIKey, Prices: testPrices, MaxBudgetUSD: maxBudget, TrustDomain: trustDomain,
	}, h.tasks, nil, logger)
	require.NoError(t, err)
	h.proxy = httptest.NewUnstartedServer(srv)
	h.proxy.TLS = h.serverTLS()
	h.proxy.StartTLS()
	t.Cleanup(h.proxy.Close)
	return h
}

func (h *harness) serverTLS() *tls.Config {
	certPEM, keyPEM, err := h.ca.MintServerCert([]string{"localhost", "127.0.0.1"}, time.Hour)
	require.NoError(h.t, err)
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	require.NoError(h.t, err)
	return &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{pair},
		ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: h.ca.Pool()}
}

// runningTask creates a task and moves it to running with a sandbox row, as Dispatch does.
func (h *harness) runningTask(owner string) string {
	h.t.Helper()
	ctx := context.Background()
	tk, _, err := h.tasks.Create(ctx, task.NewTask{Owner: owner, Repo: "acme/greet", BaseBranch: "main", Prompt: "p", Agent: task.AgentClaude}, "")
	require.NoError(h.t, err)
	_, err = h.db.Pool.Exec(ctx, `INSERT INTO sandboxes (task_id, provider, external_id, state) VALUES ($1, 'process', 'p1', 'running')`, tk.ID)
	require.NoError(h.t, err)
	tk, _, err = h.tasks.Advance(ctx, tk.ID, "", task.Advance{Status: task.StatusRunning, RequestID: "run"})
	require.NoError(h.t, err)
	require.Equal(h.t, task.StatusRunning, tk.Status)
	return tk.ID
}

// taskTLS is the client configuration of a runner of taskID.
func (h *harness) taskTLS(taskID string) *tls.Config {
	certPEM, keyPEM, err := h.ca.MintTaskCert(taskID, time.Now().Add(time.Hour))
	require.NoError(h.t, err)
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	require.NoError(h.t, err)
	return &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: h.ca.Pool(), ServerName: "localhost", Certificates: []tls.Certificate{pair}}
}

// client calls the proxy as taskID's runner.
func (h *harness) client(taskID string) *http.Client {
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: h.taskTLS(taskID), ForceAttemptHTTP2: true}}
	h.t.Cleanup(c.CloseIdleConnections)
	return c
}

// call sends one model call the way the CLIs do (with the sandbox's dummy key).
func (h *harness) call(c *http.Client, api string, stream bool) (*http.Response, []byte) {
	h.t.Helper()
	var path string
	var body map[string]any
	switch api {
	case "anthropic":
		path, body = "/anthropic/v1/messages?beta=true", map[string]any{"model": testModel, "max_tokens": 1000, "stream": stream,
			"messages": []any{map[string]any{"role": "user", "content": "hello proxy"}}}
	case "openai":
		path, body = "/openai/v1/responses", map[string]any{"model": testOpenAIModel, "stream": stream, "input": "hello proxy"}
	}
	b, err := json.Marshal(body)
	require.NoError(h.t, err)
	req, err := http.NewRequest(http.MethodPost, h.proxy.URL+path, bytes.NewReader(b))
	require.NoError(h.t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Api-Key", sandboxKey)
	req.Header.Set("Authorization", "Bearer "+sandboxKey)
	resp, err := c.Do(req)
	require.NoError(h.t, err)
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	require.NoError(h.t, err)
	return resp, out
}

// usageEvents returns the usage events on taskID's timeline, in order.
func (h *harness) usageEvents(taskID string) []map[string]any {
	h.t.Helper()
	rows, err := h.db.Pool.Query(context.Background(), `SELECT payload::text FROM task_events WHERE task_id = $1 AND type = 'usage' ORDER BY seq`, taskID)
	require.NoError(h.t, err)
	defer rows.Close()
	var out []map[string]any
	for rows.Next() {
		var p string
		require.NoError(h.t, rows.Scan(&p))
		var m map[string]any
		require.NoError(h.t, json.Unmarshal([]byte(p), &m))
		u, _ := m["usage"].(map[string]any)
		require.NotNil(h.t, u, "usage payload: %s", p)
		out = append(out, u)
	}
	require.NoError(h.t, rows.Err())
	return out
}

func (h *harness) task(id string) task.Task {
	h.t.Helper()
	tk, err := h.tasks.Get(context.Background(), id, "")
	require.NoError(h.t, err)
	return tk
}

// noSecretsIn fails when a real key appears in s.
func noSecretsIn(t *testing.T, s, what string) {
	t.Helper()
	for _, k := range []string{anthropicKey, openAIKey} {
		require.False(t, strings.Contains(s, k), "a model key appears in %s", what)
	}
}
