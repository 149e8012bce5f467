package githubtoken

import (
	"bytes"
	"context"
	"crypto/tls"
	"log/slog"
	"net"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"

	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
	"github.com/taskrunner/taskrunner/services/auth"
	"github.com/taskrunner/taskrunner/services/pki"
	"github.com/taskrunner/taskrunner/services/rpcserver"
	"github.com/taskrunner/taskrunner/services/store/storetest"
	"github.com/taskrunner/taskrunner/services/task"
	"github.com/taskrunner/taskrunner/tools/forge"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const (
	testTD    = "taskrunner.test"
	testAppID = 4242
)

// clock is a settable clock shared by the forge and the service, so JWTs and token expiry
// agree.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// logBuffer captures every log line of the code under test.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

type harness struct {
	t       *testing.T
	clock   *clock
	forge   *forge.Forge
	forgeTS *httptest.Server
	db      *storetest.DB
	redis   *storetest.Redis
	tasks   *task.Store
	ca      *pki.CA
	srv     *Server
	addr    string
	logs    *logBuffer
	appKey  string
	// secrets collects every token the tests saw, for the final log scan.
	mu      sync.Mutex
	secrets []string
	errMsgs []string
}

type harnessOpts struct {
	personalToken string // personal-token mode when set
}

func newHarness(t *testing.T, o harnessOpts) *harness {
	t.Helper()
	h := &harness{t: t, clock: &clock{now: time.Now().UTC().Truncate(time.Second)}, logs: &logBuffer{}}
	logger := slog.New(slog.NewJSONHandler(h.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	h.db = storetest.NewDB(t)
	h.redis = storetest.NewRedis(t)
	h.tasks = task.NewStore(h.db.Pool)

	dir := t.TempDir()
	h.appKey = filepath.Join(dir, "app-key.pem")
	key, created, err := forge.LoadOrCreateAppKey(h.appKey)
	require.NoError(t, err)
	require.True(t, created)
	h.forge, err = forge.New(forge.Config{
		DataDir: filepath.Join(dir, "forge"), AppID: testAppID, AppPublicKey: &key.PublicKey,
		PersonalToken: o.personalToken, Now: h.clock.Now, Logger: logger.With("component", "forge"),
	})
	require.NoError(t, err)
	h.forgeTS = httptest.NewServer(h.forge.Handler())
	t.Cleanup(func() {
		h.forgeTS.Close()
		_ = h.forge.Close()
	})
	for _, r := range []string{"acme/widgets", "acme/other", "globex/gadgets"} {
		owner, name, _ := strings.Cut(r, "/")
		require.NoError(t, h.forge.CreateRepo(owner, name, map[string]string{"README.md": "# " + r + "\n"}))
	}

	cfg := Config{
		APIURL: h.forgeTS.URL + "/", GitURL: h.forgeTS.URL, TrustDomain: testTD,
		CachePrefix: h.redis.Prefix + "githubtoken:",
	}
	if o.personalToken != "" {
		cfg.Token = o.personalToken
		h.secrets = append(h.secrets, o.personalToken)
	} else {
		cfg.AppID = "4242"
		cfg.AppKeyFile = h.appKey
	}
	h.srv, err = New(cfg, Deps{Tasks: h.tasks, Redis: h.redis.Client, Now: h.clock.Now, Logger: logger})
	require.NoError(t, err)
	t.Cleanup(h.srv.Close)

	// Real mTLS gRPC on loopback, with the shared interceptor chain.
	h.ca, err = pki.NewCA(testTD, 24*time.Hour)
	require.NoError(t, err)
	certPEM, keyPEM, err := h.ca.MintServerCert([]string{"localhost", "127.0.0.1"}, time.Hour)
	require.NoError(t, err)
	reloader, err := pki.NewReloaderFromSource(pki.Source{CertPEM: string(certPEM), KeyPEM: string(keyPEM), CAPEM: string(h.ca.CertPEM())}, logger)
	require.NoError(t, err)
	gs := rpcserver.New(rpcserver.Options{
		Logger:        logger,
		Auth:          auth.NewStore(h.db.Pool),
		Anonymous:     map[string]bool{taskrunnerv1.GitHubTokenService_IssueRepoToken_FullMethodName: true},
		ServerOptions: []grpc.ServerOption{grpc.Creds(credentials.NewTLS(pki.ServerTLSConfig(reloader)))},
	})
	taskrunnerv1.RegisterGitHubTokenServiceServer(gs, h.srv)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	h.addr = lis.Addr().String()
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = gs.Serve(lis)
	}()
	t.Cleanup(func() {
		gs.Stop()
		<-done
	})
	// Registered last, so it runs first: every token and error seen must be absent from the logs.
	t.Cleanup(h.assertNoSecretsLogged)
	return h
}

func (h *harness) assertNoSecretsLogged() {
	logs := h.logs.String()
	require.NotEmpty(h.t, logs, "the service logged nothing: the scan would prove nothing")
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, s := range h.secrets {
		require.NotContains(h.t, logs, s, "a token appears in the logs")
		for _, m := range h.errMsgs {
			require.NotContains(h.t, m, s, "a token appears in an error message")
		}
	}
	require.NotContains(h.t, logs, "ghs_", "something token-shaped appears in the logs")
}

// newTask creates a task of repo; status running when running is set (with a sandbox row, as
// Dispatch would record).
func (h *harness) newTask(repo string, running bool) task.Task {
	h.t.Helper()
	ctx := context.Background()
	tk, _, err := h.tasks.Create(ctx, task.NewTask{Owner: "alice", Repo: repo, BaseBranch: "main", Prompt: "do it", Agent: task.AgentClaude}, "")
	require.NoError(h.t, err)
	if running {
		_, err = h.db.Pool.Exec(ctx, `INSERT INTO sandboxes (task_id, provider, external_id, state) VALUES ($1, 'process', 'p1', 'running')`, tk.ID)
		require.NoError(h.t, err)
		tk, _, err = h.tasks.Advance(ctx, tk.ID, "", task.Advance{Status: task.StatusRunning, RequestID: "run-" + tk.ID})
		require.NoError(h.t, err)
		require.Equal(h.t, task.StatusRunning, tk.Status)
	}
	return tk
}

// conn dials the service over TLS, presenting a runner certificate for taskID ("" = none).
func (h *harness) conn(taskID string) taskrunnerv1.GitHubTokenServiceClient {
	h.t.Helper()
	cfg := &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: h.ca.Pool(), ServerName: "localhost"}
	if taskID != "" {
		certPEM, keyPEM, err := h.ca.MintTaskCert(taskID, h.clock.Now().Add(2*time.Hour))
		require.NoError(h.t, err)
		pair, err := tls.X509KeyPair(certPEM, keyPEM)
		require.NoError(h.t, err)
		cfg.Certificates = []tls.Certificate{pair}
	}
	cc, err := grpc.NewClient("passthrough:///"+h.addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	require.NoError(h.t, err)
	h.t.Cleanup(func() { _ = cc.Close() })
	return taskrunnerv1.NewGitHubTokenServiceClient(cc)
}

func (h *harness) issue(c taskrunnerv1.GitHubTokenServiceClient, taskID string) (*taskrunnerv1.IssueRepoTokenResponse, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := c.IssueRepoToken(ctx, &taskrunnerv1.IssueRepoTokenRequest{TaskId: taskID})
	h.mu.Lock()
	defer h.mu.Unlock()
	if err != nil {
		h.errMsgs = append(h.errMsgs, err.Error())
	} else {
		h.secrets = append(h.secrets, resp.GetToken())
	}
	return resp, err
}

// bearer returns a context carrying an API token of the given scopes.
func (h *harness) bearer(scopes ...string) context.Context {
	h.t.Helper()
	tok, _, err := auth.NewStore(h.db.Pool).Create(context.Background(), "ops", scopes, "test")
	require.NoError(h.t, err)
	return metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+tok)
}

// apiRequests returns the REST requests the forge received (not git, not admin).
func (h *harness) apiRequests() []forge.Request {
	var out []forge.Request
	for _, r := range h.forge.Requests() {
		if r.Kind == "api" {
			out = append(out, r)
		}
	}
	return out
}

func countPath(reqs []forge.Request, method, suffix string) int {
	n := 0
	for _, r := range reqs {
		if r.Method == method && strings.HasSuffix(r.Path, suffix) {
			n++
		}
	}
	return n
}

// lastGit returns the last git request the forge answered.
func (h *harness) lastGit() forge.Request {
	var last forge.Request
	for _, r := range h.forge.Requests() {
		if r.Kind == "git" {
			last = r
		}
	}
	return last
}
