package webhook

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha1"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/taskrunner/taskrunner/platform/rpcauth"
	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
	"github.com/taskrunner/taskrunner/services/auth"
	"github.com/taskrunner/taskrunner/services/errs"
	"github.com/taskrunner/taskrunner/services/rpcserver"
	"github.com/taskrunner/taskrunner/services/store/storetest"
	"github.com/taskrunner/taskrunner/services/task"
	"github.com/taskrunner/taskrunner/tools/forge"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const secret = "webhook-secret-for-tests-0123456789"

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

// storeReader answers GetTask for any owner straight from the tasks table, which is what
// TaskService must do for an internal-scope caller; AdvanceTask goes to the real TaskService
// over gRPC.
type storeReader struct {
	taskrunnerv1.TaskServiceClient
	store *task.Store
}

func (s storeReader) GetTask(ctx context.Context, in *taskrunnerv1.GetTaskRequest, _ ...grpc.CallOption) (*taskrunnerv1.GetTaskResponse, error) {
	t, err := s.store.Get(ctx, in.GetId(), "")
	if err != nil {
		// The same mapping the gRPC server applies.
		st, _ := errs.ToStatus(err)
		return nil, st.Err()
	}
	return &taskrunnerv1.GetTaskResponse{Task: task.ToProto(t)}, nil
}

type env struct {
	t        *testing.T
	db       *storetest.DB
	store    *task.Store
	handler  *Handler
	logs     *logBuffer
	apiToken string
	srv      *httptest.Server
}

func newEnv(t *testing.T, opts ...Option) *env {
	t.Helper()
	e := &env{t: t, logs: &logBuffer{}}
	logger := slog.New(slog.NewJSONHandler(e.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	e.db = storetest.NewDB(t)
	e.store = task.NewStore(e.db.Pool)
	authStore := auth.NewStore(e.db.Pool)
	var err error
	e.apiToken, _, err = authStore.Create(context.Background(), "gateway", []string{auth.ScopeInternal}, "webhook")
	require.NoError(t, err)

	// The real TaskService behind the shared interceptor chain, on loopback.
	gs := rpcserver.New(rpcserver.Options{Logger: logger, Auth: authStore})
	taskrunnerv1.RegisterTaskServiceServer(gs, task.New(e.store, nil, logger))
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = gs.Serve(lis)
	}()
	conn, err := grpc.NewClient("passthrough:///"+lis.Addr().String(),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithPerRPCCredentials(rpcauth.BearerToken(e.apiToken)))
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = conn.Close()
		gs.Stop()
		<-done
	})
	e.handler, err = New(Config{Secret: secret}, storeReader{taskrunnerv1.NewTaskServiceClient(conn), e.store}, logger, opts...)
	require.NoError(t, err)
	e.srv = httptest.NewServer(e.handler)
	t.Cleanup(e.srv.Close)
	t.Cleanup(func() {
		logs := e.logs.String()
		require.NotEmpty(t, logs)
		require.NotContains(t, logs, e.apiToken)
		require.NotContains(t, logs, secret)
		require.NotContains(t, logs, "trt_")
	})
	return e
}

// awaitingReview creates a task of repo whose PR #prNumber is open.
func (e *env) awaitingReview(repo string, prNumber int64) task.Task {
	e.t.Helper()
	ctx := context.Background()
	tk, _, err := e.store.Create(ctx, task.NewTask{Owner: "alice", Repo: repo, BaseBranch: "main", Prompt: "p", Agent: task.AgentClaude}, "")
	require.NoError(e.t, err)
	_, err = e.db.Pool.Exec(ctx, `INSERT INTO sandboxes (task_id, provider) VALUES ($1, 'process')`, tk.ID)
	require.NoError(e.t, err)
	_, _, err = e.store.Advance(ctx, tk.ID, "", task.Advance{Status: task.StatusRunning, RequestID: "dispatch"})
	require.NoError(e.t, err)
	tk, _, err = e.store.Advance(ctx, tk.ID, "", task.Advance{Status: task.StatusAwaitingReview, Seq: 1,
		PRURL: fmt.Sprintf("https://github.com/%s/pull/%d", repo, prNumber), PRNumber: prNumber})
	require.NoError(e.t, err)
	require.Equal(e.t, task.StatusAwaitingReview, tk.Status)
	return tk
}

// snapshot is every row of tasks and task_requests, as JSON.
func (e *env) snapshot() string {
	e.t.Helper()
	var s string
	require.NoError(e.t, e.db.Pool.QueryRow(context.Background(), `SELECT
		(SELECT coalesce(json_agg(t ORDER BY t.id), '[]') FROM tasks t)::text || ' ' ||
		(SELECT coalesce(json_agg(r ORDER BY r.task_id, r.request_id), '[]') FROM task_requests r)::text`).Scan(&s))
	return s
}

func payload(action string, merged bool, repo, ref string, number int64) []byte {
	b, _ := json.Marshal(map[string]any{
		"action": action, "number": number,
		"pull_request": map[string]any{
			"number": number, "merged": merged, "state": "closed",
			"head": map[string]any{"ref": ref, "repo": map[string]any{"full_name": repo}},
			"base": map[string]any{"ref": "main", "repo": map[string]any{"full_name": repo}},
		},
		"repository": map[string]any{"full_name": repo},
	})
	return b
}

type delivery struct {
	method, event, id, signature, contentType string
	body                                      []byte
}

func sha1Signature(key string, body []byte) string {
	mac := hmac.New(sha1.New, []byte(key))
	mac.Write(body)
	return "sha1=" + hex.EncodeToString(mac.Sum(nil))
}

// formEncoded is a delivery of a hook configured with content type
// application/x-www-form-urlencoded: the JSON is the "payload" field, the signature covers the
// form body.
func formEncoded(event, id string, payload []byte) delivery {
	body := []byte(url.Values{"payload": {string(payload)}}.Encode())
	return delivery{event: event, id: id, body: body, signature: forge.Signature(secret, body), contentType: "application/x-www-form-urlencoded"}
}

// apiError is the API's error shape, {code, message, details}.
type apiError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
	Details []struct {
		Type     string            `json:"@type"`
		Reason   string            `json:"reason"`
		Domain   string            `json:"domain"`
		Metadata map[string]string `json:"metadata"`
	} `json:"details"`
}

// reason is the ErrorInfo reason of an error answer, "" for any other answer.
func (a apiError) reason() string {
	for _, d := range a.Details {
		if d.Type == "type.googleapis.com/google.rpc.ErrorInfo" {
			return d.Reason
		}
	}
	return ""
}

func (e *env) send(d delivery) (int, reply) {
	e.t.Helper()
	code, r, _ := e.sendFull(d)
	return code, r
}

// sendFull returns the status, the 2xx reply and the error answer (one of them is zero).
func (e *env) sendFull(d delivery) (int, reply, apiError) {
	e.t.Helper()
	if d.method == "" {
		d.method = http.MethodPost
	}
	req, err := http.NewRequest(d.method, e.srv.URL+Path, bytes.NewReader(d.body))
	require.NoError(e.t, err)
	if d.event != "" {
		req.Header.Set("X-GitHub-Event", d.event)
	}
	if d.id != "" {
		req.Header.Set("X-GitHub-Delivery", d.id)
	}
	if d.signature != "" {
		req.Header.Set("X-Hub-Signature-256", d.signature)
	}
	if d.contentType != "" {
		req.Header.Set("Content-Type", d.contentType)
	}
	resp, err := e.srv.Client().Do(req)
	require.NoError(e.t, err)
	defer resp.Body.Close()
	var r reply
	var ae apiError
	data, _ := io.ReadAll(resp.Body)
	if len(data) > 0 {
		require.Equal(e.t, "application/json", resp.Header.Get("Content-Type"))
		if resp.StatusCode >= 400 {
			require.NoError(e.t, json.Unmarshal(data, &ae), "body %q", data)
			require.NotZero(e.t, ae.Code, "body %q", data)
			require.NotEmpty(e.t, ae.Message)
			require.NotContains(e.t, string(data), `"result"`)
		} else {
			require.NoError(e.t, json.Unmarshal(data, &r), "body %q", data)
		}
	}
	return resp.StatusCode, r, ae
}

func signed(event, id string, body []byte) delivery {
	return delivery{event: event, id: id, body: body, signature: forge.Signature(secret, body)}
}

func TestTransitions(t *testing.T) {
	e := newEnv(t)
	tests := []struct {
		name       string
		merged     bool
		wantStatus task.Status
		wantReason string
	}{
		{"merged → done", true, task.StatusDone, ""},
		{"closed unmerged → cancelled", false, task.StatusCancelled, "pull request #7 closed without merge"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tk := e.awaitingReview("acme/widgets", 7)
			d := signed("pull_request", "d-"+tk.ID, payload("closed", tc.merged, "acme/widgets", tk.HeadBranch, 7))
			code, r := e.send(d)
			require.Equal(t, http.StatusOK, code)
			require.Equal(t, reply{Result: "applied", TaskID: tk.ID, Status: task.StatusToProto(tc.wantStatus).String()}, r)
			got, err := e.store.Get(context.Background(), tk.ID, "")
			require.NoError(t, err)
			require.Equal(t, tc.wantStatus, got.Status)
			require.Equal(t, tc.wantReason, got.FailedReason)

			// The same delivery again changes nothing.
			before := e.snapshot()
			code, r = e.send(d)
			require.Equal(t, http.StatusOK, code)
			require.Equal(t, "duplicate", r.Result)
			require.Equal(t, before, e.snapshot())

			// A different delivery for the finished task is acknowledged and changes nothing.
			code, r = e.send(signed("pull_request", "other-"+tk.ID, payload("closed", !tc.merged, "acme/widgets", tk.HeadBranch, 7)))
			require.Equal(t, http.StatusAccepted, code)
			require.Equal(t, "ignored", r.Result)
			require.Equal(t, before, e.snapshot())
		})
	}
}

func TestRefusedAndIgnoredDeliveries(t *testing.T) {
	e := newEnv(t)
	tk := e.awaitingReview("acme/widgets", 7)
	running, _, err := e.store.Create(context.Background(), task.NewTask{Owner: "bob", Repo: "acme/widgets", BaseBranch: "main", Prompt: "p", Agent: task.AgentClaude}, "")
	require.NoError(t, err)
	good := payload("closed", true, "acme/widgets", tk.HeadBranch, 7)
	fork := payload("closed", true, "acme/widgets", tk.HeadBranch, 7)
	fork = bytes.Replace(fork, []byte(`"head":{"ref":"`+tk.HeadBranch+`","repo":{"full_name":"acme/widgets"}}`),
		[]byte(`"head":{"ref":"`+tk.HeadBranch+`","repo":{"full_name":"mallory/widgets"}}`), 1)
	require.NotEqual(t, good, fork)
	huge := append(append([]byte(`{"pad":"`), bytes.Repeat([]byte("x"), 1<<20)...), []byte(`"}`)...)

	tests := []struct {
		name     string
		d        delivery
		wantCode int
		wantRes  string // the 2xx result, or the error's ErrorInfo reason
	}{
		{"missing signature", delivery{event: "pull_request", id: "1", body: good}, http.StatusUnauthorized, "BAD_SIGNATURE"},
		{"signature by another secret", delivery{event: "pull_request", id: "2", body: good, signature: forge.Signature("not-the-secret-at-all", good)}, http.StatusUnauthorized, "BAD_SIGNATURE"},
		{"signature of another body", delivery{event: "pull_request", id: "3", body: good, signature: forge.Signature(secret, []byte("{}"))}, http.StatusUnauthorized, "BAD_SIGNATURE"},
		{"sha1 signature only", delivery{event: "pull_request", id: "4", body: good, signature: "sha1=0123"}, http.StatusUnauthorized, "BAD_SIGNATURE"},
		{"valid sha1 signature in the sha256 header", delivery{event: "pull_request", id: "4b", body: good, signature: sha1Signature(secret, good)}, http.StatusUnauthorized, "BAD_SIGNATURE"},
		{"unsupported content type", delivery{event: "pull_request", id: "4c", body: good, signature: forge.Signature(secret, good), contentType: "text/plain"}, http.StatusUnsupportedMediaType, "UNSUPPORTED_CONTENT_TYPE"},
		{"form-encoded hook", formEncoded("pull_request", "4d", payload("opened", false, "acme/widgets", tk.HeadBranch, 7)), http.StatusAccepted, "ignored"},
		{"malformed JSON", signed("pull_request", "5", []byte(`{"action":"closed",`)), http.StatusBadRequest, "BAD_PAYLOAD"},
		{"JSON of the wrong shape", signed("pull_request", "6", []byte(`{"action":"closed","pull_request":"x"}`)), http.StatusBadRequest, "BAD_PAYLOAD"},
		{"no event header", signed("", "7", good), http.StatusBadRequest, "MISSING_EVENT"},
		{"no delivery header", signed("pull_request", "", good), http.StatusBadRequest, "BAD_DELIVERY_ID"},
		{"GET", delivery{method: http.MethodGet}, http.StatusMethodNotAllowed, "METHOD_NOT_ALLOWED"},
		{"body over 1 MiB", signed("pull_request", "8", huge), http.StatusRequestEntityTooLarge, "BODY_TOO_LARGE"},
		{"ping", signed("ping", "9", []byte(`{"zen":"Keep it logically awesome."}`)), http.StatusNoContent, ""},
		{"unknown event", signed("issues", "10", []byte(`{"action":"opened"}`)), http.StatusAccepted, "ignored"},
		{"unknown action", signed("pull_request", "11", payload("opened", false, "acme/widgets", tk.HeadBranch, 7)), http.StatusAccepted, "ignored"},
		{"not a taskrunner branch", signed("pull_request", "12", payload("closed", true, "acme/widgets", "feature/x", 7)), http.StatusAccepted, "ignored"},
		{"unknown task", signed("pull_request", "13", payload("closed", true, "acme/widgets", task.HeadBranch("0b7f6a0e-4a49-4d6c-9d0e-6f0a8f2f1e11"), 7)), http.StatusAccepted, "ignored"},
		{"repository is not the task's", signed("pull_request", "14", payload("closed", true, "acme/other", tk.HeadBranch, 7)), http.StatusAccepted, "ignored"},
		{"head branch in a fork", signed("pull_request", "15", fork), http.StatusAccepted, "ignored"},
		{"another pull request number", signed("pull_request", "16", payload("closed", true, "acme/widgets", tk.HeadBranch, 8)), http.StatusAccepted, "ignored"},
		{"task not awaiting review", signed("pull_request", "17", payload("closed", false, "acme/widgets", running.HeadBranch, 7)), http.StatusAccepted, "ignored"},
	}
	before := e.snapshot()
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, r, ae := e.sendFull(tc.d)
			require.Equal(t, tc.wantCode, code)
			if code >= 400 {
				require.Equal(t, tc.wantRes, ae.reason())
				require.Empty(t, r.Result)
			} else {
				require.Equal(t, tc.wantRes, r.Result)
			}
			require.Equal(t, before, e.snapshot(), "no row may change")
		})
	}
}

func TestConfigValidate(t *testing.T) {
	require.ErrorContains(t, Config{}.Validate(), "TASKRUNNER_GITHUB_WEBHOOK_SECRET")
	require.ErrorContains(t, Config{Secret: "short"}.Validate(), "at least 16")
	require.NotContains(t, Config{Secret: "short"}.Validate().Error(), "short")
	require.NoError(t, Config{Secret: secret}.Validate())
	_, err := New(Config{Secret: secret}, nil, nil)
	require.Error(t, err)
}

// TestMergeOnForgeEndToEnd merges a real pull request on the forge; the forge delivers the
// signed webhook to the receiver, which moves the task to done through TaskService.
func TestMergeOnForgeEndToEnd(t *testing.T) {
	e := newEnv(t)
	f, fs := e.newForge(t)

	tests := []struct {
		name       string
		merge      bool
		wantStatus task.Status
		wantReason string
	}{
		{"merge", true, task.StatusDone, ""},
		{"close", false, task.StatusCancelled, "pull request #2 closed without merge"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tk, _, err := e.store.Create(context.Background(), task.NewTask{Owner: "alice", Repo: "acme/widgets", BaseBranch: "main", Prompt: "p", Agent: task.AgentClaude}, "")
			require.NoError(t, err)
			pushBranch(t, f, tk.HeadBranch)
			var pr struct {
				Number  int64  `json:"number"`
				HTMLURL string `json:"html_url"`
			}
			forgeCall(t, fs.URL, pat, http.MethodPost, "/repos/acme/widgets/pulls",
				map[string]any{"title": "change", "head": tk.HeadBranch, "base": "main"}, http.StatusCreated, &pr)
			ctx := context.Background()
			_, err = e.db.Pool.Exec(ctx, `INSERT INTO sandboxes (task_id, provider) VALUES ($1, 'process')`, tk.ID)
			require.NoError(t, err)
			_, _, err = e.store.Advance(ctx, tk.ID, "", task.Advance{Status: task.StatusRunning, RequestID: "dispatch"})
			require.NoError(t, err)
			_, _, err = e.store.Advance(ctx, tk.ID, "", task.Advance{Status: task.StatusAwaitingReview, Seq: 1, PRURL: pr.HTMLURL, PRNumber: pr.Number})
			require.NoError(t, err)

			if tc.merge {
				forgeCall(t, fs.URL, pat, http.MethodPut, fmt.Sprintf("/repos/acme/widgets/pulls/%d/merge", pr.Number), map[string]any{}, http.StatusOK, nil)
			} else {
				forgeCall(t, fs.URL, pat, http.MethodPatch, fmt.Sprintf("/repos/acme/widgets/pulls/%d", pr.Number), map[string]any{"state": "closed"}, http.StatusOK, nil)
			}
			require.Eventually(t, func() bool {
				got, err := e.store.Get(ctx, tk.ID, "")
				return err == nil && got.Status == tc.wantStatus
			}, 15*time.Second, 20*time.Millisecond)
			got, err := e.store.Get(ctx, tk.ID, "")
			require.NoError(t, err)
			require.Equal(t, tc.wantReason, got.FailedReason)
			require.Eventually(t, func() bool { return len(f.Deliveries()) > 0 && f.Deliveries()[len(f.Deliveries())-1].StatusCode != 0 },
				15*time.Second, 20*time.Millisecond)
			last := f.Deliveries()[len(f.Deliveries())-1]
			require.Equal(t, http.StatusOK, last.StatusCode)
			require.Equal(t, "closed", last.Action)
		})
	}
}

// pat is the forge's personal token in these tests.
const pat = "ghp_forgeAdminTokenForTheTest0123456789"

// newForge starts a forge with repository acme/widgets that sends its webhooks to the receiver.
func (e *env) newForge(t *testing.T) (*forge.Forge, *httptest.Server) {
	t.Helper()
	dir := t.TempDir()
	key, _, err := forge.LoadOrCreateAppKey(filepath.Join(dir, "app.pem"))
	require.NoError(t, err)
	f, err := forge.New(forge.Config{DataDir: filepath.Join(dir, "forge"), AppID: 1, AppPublicKey: &key.PublicKey,
		PersonalToken: pat, WebhookURL: e.srv.URL + Path, WebhookSecret: secret})
	require.NoError(t, err)
	fs := httptest.NewServer(f.Handler())
	t.Cleanup(func() {
		fs.Close()
		_ = f.Close()
	})
	require.NoError(t, f.CreateRepo("acme", "widgets", map[string]string{"README.md": "hi\n"}))
	return f, fs
}

// pushBranch commits a change on branch straight into the forge's bare repository.
func pushBranch(t *testing.T, f *forge.Forge, branch string) {
	t.Helper()
	bare, ok := f.RepoDir("acme", "widgets")
	require.True(t, ok)
	work := t.TempDir()
	run := func(dir string, args ...string) {
		cmd := exec.Command("git", append([]string{"-c", "user.name=r", "-c", "user.email=r@example.com"}, args...)...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null")
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "git %v: %s", args, out)
	}
	run(work, "clone", "-q", bare, "repo")
	repo := filepath.Join(work, "repo")
	require.NoError(t, os.WriteFile(filepath.Join(repo, strings.ReplaceAll(branch, "/", "-")+".txt"), []byte("x\n"), 0o644))
	run(repo, "add", ".")
	run(repo, "commit", "-q", "-m", "change")
	run(repo, "push", "-q", "origin", "HEAD:refs/heads/"+branch)
}

func forgeCall(t *testing.T, base, token, method, path string, in any, wantCode int, out any) {
	t.Helper()
	body, err := json.Marshal(in)
	require.NoError(t, err)
	req, err := http.NewRequest(method, base+path, bytes.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Authorization", "token "+token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, wantCode, resp.StatusCode, "%s %s: %s", method, path, data)
	if out != nil {
		require.NoError(t, json.Unmarshal(data, out))
	}
	http.DefaultClient.CloseIdleConnections()
}
