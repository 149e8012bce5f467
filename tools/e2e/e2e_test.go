package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/taskrunner/taskrunner/services/store/storetest"
)

func repoRoot(t *testing.T) string {
	dir, err := filepath.Abs("../..")
	require.NoError(t, err)
	require.FileExists(t, filepath.Join(dir, "go.work"))
	return dir
}

// freePort picks a port that is free now, below the kernel's ephemeral
// range (32768 and up): a port the kernel handed out (":0") can be handed
// again to some process's outgoing connection before the stack binds it,
// which made a busy machine's stack fail with "address already in use".
func freePort(t *testing.T) string {
	t.Helper()
	for range 200 {
		port := 20000 + rand.IntN(12000)
		if usedPorts.Load(port) {
			continue
		}
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
		if err != nil {
			continue
		}
		_ = l.Close()
		usedPorts.Store(port)
		return strconv.Itoa(port)
	}
	t.Fatal("no free port below the ephemeral range")
	return ""
}

// usedPorts remembers the ports this test process handed out already.
var usedPorts portSet

type portSet struct {
	mu sync.Mutex
	m  map[int]bool
}

func (p *portSet) Load(port int) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.m[port]
}

func (p *portSet) Store(port int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.m == nil {
		p.m = map[int]bool{}
	}
	p.m[port] = true
}

// binaries returns a directory holding every binary, building what is
// missing (make test builds them into .dev/bin first).
func binaries(t *testing.T, root string) string {
	dir := os.Getenv("TASKRUNNER_BIN_DIR")
	if dir == "" {
		dir = t.TempDir()
		cmd := exec.Command("go", "build", "-o", dir+"/", "./services/cmd/taskrunnerd", "./gateway/cmd/gateway", "./tools/cmd/taskctl",
			"./tools/cmd/forge", "./tools/cmd/modelapi", "./tools/cmd/devstack", "./runner/cmd/runner")
		cmd.Dir = root
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, string(out))
	}
	for _, b := range []string{"taskrunnerd", "gateway", "forge", "modelapi", "devstack", "runner"} {
		require.FileExists(t, filepath.Join(dir, b))
	}
	return dir
}

type stack struct {
	t                  *testing.T
	dev, api, forgeURL string
	jaegerURL          string
	metricsAddr        string
	token, forgeToken  string
	cmd                *exec.Cmd
	done               chan error
	out                *syncBuffer
	clone              string // a clone of demo/greet for follow-up checks (git)
	modelURL, codexURL string // the scripted model APIs (Anthropic, OpenAI)
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
func (s *syncBuffer) String() string { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// startStack starts the whole stack with devstack; extraEnv is added to
// its environment (e.g. a lower budget).
func startStack(t *testing.T, extraEnv ...string) *stack {
	root := repoRoot(t)
	if _, err := os.Stat(filepath.Join(root, "node_modules", ".bin", "claude")); err != nil {
		if os.Getenv("TASKRUNNER_REQUIRE_AGENTS") != "" {
			t.Fatalf("the Claude Code CLI is not installed (run npm ci): %v", err)
		}
		t.Skip("node_modules/.bin/claude not installed; run `make test`")
	}
	bin := binaries(t, root)
	if _, err := os.Stat(filepath.Join(bin, "jaeger")); err != nil {
		if os.Getenv("TASKRUNNER_REQUIRE_SERVICES") != "" {
			t.Fatalf("jaeger is not built in %s (make jaeger): %v", bin, err)
		}
		t.Skip("jaeger not built; run `make test`")
	}
	// Not t.TempDir(): its 0700 parent would lock out the unprivileged agent.
	dev, err := os.MkdirTemp("", "taskrunner-e2e-")
	require.NoError(t, err)
	require.NoError(t, os.Chmod(dev, 0o755))
	t.Cleanup(func() { _ = os.RemoveAll(dev) })
	suffix := strconv.FormatInt(time.Now().UnixNano()%1e9, 36)
	dbURL := regexp.MustCompile(`/[^/?]*(\?|$)`).ReplaceAllString(storetest.DatabaseURL(), "/taskrunner_e2e_"+suffix+"$1")
	ports := map[string]string{}
	for _, k := range []string{"http", "grpc", "runner", "forge", "model", "codex", "metrics", "ui", "otlp", "otlpgrpc", "query", "modelproxy"} {
		ports[k] = freePort(t)
	}
	s := &stack{t: t, dev: dev, api: "http://127.0.0.1:" + ports["http"], forgeURL: "http://127.0.0.1:" + ports["forge"],
		jaegerURL: "http://127.0.0.1:" + ports["ui"], metricsAddr: "127.0.0.1:" + ports["metrics"], out: &syncBuffer{}, done: make(chan error, 1)}
	cmd := exec.Command(filepath.Join(bin, "devstack"), "up", "--dev-dir", dev, "--bin-dir", bin)
	cmd.Dir = root
	cmd.Env = append(os.Environ(),
		"TASKRUNNER_DATABASE_URL="+dbURL, "TASKRUNNER_REDIS_URL="+storetest.RedisURL(), "TASKRUNNER_REDIS_PREFIX=e2e-"+suffix+":",
		"TASKRUNNER_HTTP_ADDR=127.0.0.1:"+ports["http"], "TASKRUNNER_GRPC_ADDR=127.0.0.1:"+ports["grpc"],
		"TASKRUNNER_RUNNER_GRPC_ADDR=127.0.0.1:"+ports["runner"], "DEVSTACK_FORGE_ADDR=127.0.0.1:"+ports["forge"],
		"DEVSTACK_MODELAPI_ADDR=127.0.0.1:"+ports["model"], "DEVSTACK_CODEX_MODELAPI_ADDR=127.0.0.1:"+ports["codex"],
		"TASKRUNNER_METRICS_ADDR="+s.metricsAddr, "TASKRUNNER_MODEL_PROXY_ADDR=127.0.0.1:"+ports["modelproxy"], "OPENAI_API_KEY=",
		"JAEGER_UI_PORT="+ports["ui"], "JAEGER_OTLP_HTTP_PORT="+ports["otlp"], "JAEGER_OTLP_GRPC_PORT="+ports["otlpgrpc"],
		"JAEGER_QUERY_GRPC_PORT="+ports["query"], "ANTHROPIC_API_KEY=", "TASKRUNNER_GITHUB_APP_ID=", "TASKRUNNER_GITHUB_TOKEN=",
		"OTEL_EXPORTER_OTLP_ENDPOINT=", "TASKRUNNER_REAPER_INTERVAL=2s")
	cmd.Env = append(cmd.Env, extraEnv...)
	s.modelURL, s.codexURL = "http://127.0.0.1:"+ports["model"], "http://127.0.0.1:"+ports["codex"]
	cmd.Stdout, cmd.Stderr = s.out, s.out
	// Clean up after the stack has stopped (cleanups run last-in, first-out).
	t.Cleanup(func() { dropTestState(dbURL, "e2e-"+suffix+":") })
	require.NoError(t, cmd.Start())
	s.cmd = cmd
	go func() { s.done <- cmd.Wait() }()
	t.Cleanup(s.stop)
	deadline := time.After(3 * time.Minute)
	for !strings.Contains(s.out.String(), "taskrunner is up") {
		select {
		case err := <-s.done:
			t.Fatalf("devstack exited: %v\n%s", err, s.out)
		case <-deadline:
			t.Fatalf("stack not up after 3 minutes:\n%s", s.out)
		case <-time.After(100 * time.Millisecond):
		}
	}
	b, err := os.ReadFile(filepath.Join(dev, "token"))
	require.NoError(t, err)
	s.token = strings.TrimSpace(string(b))
	sec, err := os.ReadFile(filepath.Join(dev, "secrets.env"))
	require.NoError(t, err)
	for _, l := range strings.Split(string(sec), "\n") {
		if v, ok := strings.CutPrefix(l, "forge="); ok {
			s.forgeToken = v
		}
	}
	return s
}

func (s *stack) stop() {
	if s.cmd == nil || s.cmd.ProcessState != nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-s.done:
	case <-time.After(60 * time.Second):
		_ = s.cmd.Process.Kill()
	}
	if s.t.Failed() {
		for _, name := range []string{"taskrunnerd", "gateway", "forge", "modelapi", "jaeger"} {
			b, _ := os.ReadFile(filepath.Join(s.dev, "logs", name+".log"))
			if len(b) > 4000 {
				b = b[len(b)-4000:]
			}
			s.t.Logf("--- %s.log (tail) ---\n%s", name, b)
		}
	}
}

func (s *stack) do(t *testing.T, method, url, auth, body string) (int, map[string]any) {
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	require.NoError(t, err)
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var out map[string]any
	b, _ := io.ReadAll(resp.Body)
	_ = json.Unmarshal(b, &out)
	return resp.StatusCode, out
}

type sseEvent struct {
	id, name string
	data     map[string]any
	// end is set on a pseudo-event sent when the stream ends: why it did.
	end string
}

// follow reads the task's SSE stream in the background: every event goes
// to the returned channel, which is closed when the stream ends.
func (s *stack) follow(t *testing.T, id, lastEventID string) (<-chan sseEvent, int) {
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.api+"/v1/tasks/"+id+"/events", nil)
	req.Header.Set("Authorization", "Bearer "+s.token)
	if lastEventID != "" {
		req.Header.Set("Last-Event-ID", lastEventID)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	out := make(chan sseEvent, 1024)
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		cancel()
		close(out)
		return out, resp.StatusCode
	}
	require.Equal(t, "text/event-stream", strings.Split(resp.Header.Get("Content-Type"), ";")[0])
	go func() {
		defer cancel()
		defer resp.Body.Close()
		defer close(out)
		var cur sseEvent
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		defer func() { out <- sseEvent{end: fmt.Sprintf("stream ended: %v (last id %s)", sc.Err(), cur.id)} }()
		for sc.Scan() {
			line := sc.Text()
			switch {
			case strings.HasPrefix(line, "id: "):
				cur.id = strings.TrimPrefix(line, "id: ")
			case strings.HasPrefix(line, "event: "):
				cur.name = strings.TrimPrefix(line, "event: ")
			case strings.HasPrefix(line, "data: "):
				if json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &cur.data) != nil {
					cur.data = map[string]any{"undecodable": line}
				}
			case line == "" && cur.name != "":
				out <- cur
				cur = sseEvent{}
			}
		}
	}()
	return out, resp.StatusCode
}

// until collects events from ch up to and including the first for which
// stop is true (or to the end of the stream).
func until(t *testing.T, ch <-chan sseEvent, stop func(sseEvent) bool) []sseEvent {
	t.Helper()
	var evs []sseEvent
	timeout := time.After(5 * time.Minute)
	for {
		select {
		case e, ok := <-ch:
			if !ok {
				return evs
			}
			if e.end != "" {
				t.Logf("%s after %d events: %v", e.end, len(evs), timelineOf(evs))
				continue
			}
			evs = append(evs, e)
			if stop(e) {
				return evs
			}
		case <-timeout:
			t.Fatalf("the stream gave %d events and no end", len(evs))
		}
	}
}

// statusTo is the status a status_change frame moves to ("" otherwise).
func statusTo(e sseEvent) string {
	if e.name != "status_change" {
		return ""
	}
	to, _ := e.data["status_change"].(map[string]any)["to"].(string)
	return to
}

// timelineOf renders events as "type" or "status_change:<to>/<actor>".
func timelineOf(evs []sseEvent) []string {
	var out []string
	for _, e := range evs {
		switch e.name {
		case "status_change":
			sc := e.data["status_change"].(map[string]any)
			out = append(out, fmt.Sprintf("status_change:%s/%s", strings.TrimPrefix(sc["to"].(string), "TASK_STATUS_"), sc["actor"]))
		case "sandbox":
			out = append(out, "sandbox:"+e.data["sandbox"].(map[string]any)["state"].(string))
		case "failed":
			out = append(out, fmt.Sprintf("failed(%v)", e.data["failed"].(map[string]any)["reason"]))
		default:
			out = append(out, e.name)
		}
	}
	return out
}

func TestEndToEnd(t *testing.T) {
	s := startStack(t)
	bearer := "Bearer " + s.token

	// Create (proposing), then dispatch with its own REST call: the
	// dispatch still joins the task's one trace.
	code, body := s.do(t, http.MethodPost, s.api+"/v1/tasks", bearer, `{"repo":"demo/greet","prompt":"Add a --farewell flag to greet"}`)
	require.Equal(t, http.StatusOK, code, body)
	task := body["task"].(map[string]any)
	require.Equal(t, "TASK_STATUS_PROPOSING", task["status"])
	id := task["id"].(string)
	traceID := task["trace_id"].(string)
	require.Len(t, traceID, 32, "the task resource shows its trace id")
	code, body = s.do(t, http.MethodPost, s.api+"/v1/tasks/"+id+":dispatch", bearer, `{}`)
	require.Equal(t, http.StatusOK, code, body)
	require.Equal(t, "TASK_STATUS_RUNNING", body["task"].(map[string]any)["status"])

	keys := watchForModelKeys(t, id)
	stream, code := s.follow(t, id, "")
	require.Equal(t, http.StatusOK, code)
	// The stream stays open through awaiting_review.
	evs := until(t, stream, func(e sseEvent) bool { return statusTo(e) == "TASK_STATUS_AWAITING_REVIEW" })
	require.NotEmpty(t, evs)
	// Caught up, the stream parks: the real gateway's middleware (tracing,
	// REST error shape, CORS) lets its connection be taken over.
	require.Eventually(t, func() bool {
		resp, err := http.Get(s.api + "/metrics")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return metricValue(t, string(b), "taskrunner_sse_parked") >= 1
	}, 10*time.Second, 50*time.Millisecond, "no parked SSE stream in the gateway's /metrics")
	var stages []string
	var lastDiff map[string]any
	prev := 0
	for _, e := range evs {
		n, err := strconv.Atoi(e.id)
		require.NoError(t, err)
		require.Equal(t, prev+1, n, "SSE ids are the event sequence, no gap, no duplicate")
		prev = n
		switch e.name {
		case "stage_change":
			stages = append(stages, e.data["stage_change"].(map[string]any)["stage"].(string))
		case "diff_stats":
			lastDiff = e.data["diff_stats"].(map[string]any)
		}
	}
	require.Equal(t, []string{"TASK_STAGE_EXPLORE", "TASK_STAGE_PROPOSE", "TASK_STAGE_APPLY", "TASK_STAGE_ARCHIVE"}, stages)
	last := evs[len(evs)-2]
	require.Equal(t, "completed", last.name, "the runner's last event is completed, then the status change")
	prURL := last.data["completed"].(map[string]any)["pr_url"].(string)
	require.True(t, strings.HasPrefix(prURL, s.forgeURL+"/demo/greet/pull/"), prURL)
	require.NotNil(t, lastDiff)

	// The PR branch holds the archived OpenSpec change and the code edit,
	// and its diff against main is what the runner reported.
	clone := filepath.Join(t.TempDir(), "greet")
	git := func(args ...string) string {
		cmd := exec.Command("git", append([]string{"-c", "http.extraHeader=Authorization: token " + s.forgeToken}, args...)...)
		cmd.Dir = filepath.Dir(clone)
		if _, err := os.Stat(clone); err == nil {
			cmd.Dir = clone
		}
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, string(out))
		return string(out)
	}
	git("clone", "-q", s.forgeURL+"/demo/greet.git", clone)
	git("fetch", "-q", "origin", "taskrunner/"+id)
	files := git("ls-tree", "-r", "--name-only", "FETCH_HEAD")
	require.Regexp(t, `openspec/changes/archive/[0-9-]+-add-farewell/proposal.md`, files)
	require.Contains(t, files, "openspec/specs/greet/spec.md")
	require.Contains(t, git("show", "FETCH_HEAD:greet"), "farewell")
	var add, del, n int64
	for _, l := range strings.Split(strings.TrimSpace(git("diff", "--numstat", "origin/main", "FETCH_HEAD")), "\n") {
		f := strings.Fields(l)
		a, _ := strconv.ParseInt(f[0], 10, 64)
		d, _ := strconv.ParseInt(f[1], 10, 64)
		add, del, n = add+a, del+d, n+1
	}
	require.Equal(t, fmt.Sprint(add), fmt.Sprint(lastDiff["additions"]))
	require.Equal(t, fmt.Sprint(del), fmt.Sprint(lastDiff["deletions"]))
	require.Equal(t, fmt.Sprint(n), fmt.Sprint(lastDiff["files_changed"]))

	code, body = s.do(t, http.MethodGet, s.api+"/v1/tasks/"+id, bearer, "")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "TASK_STATUS_AWAITING_REVIEW", body["task"].(map[string]any)["status"])

	// No model key ever entered the sandbox: the model proxy held it.
	keys.check(t, "claude")
	var scanned int
	require.NoError(t, filepath.WalkDir(filepath.Join(s.dev, "sandboxes"), func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !d.Type().IsRegular() {
			return nil // gone already, or not a file
		}
		b, err := os.ReadFile(path)
		if err == nil {
			scanned++
			require.NotContains(t, string(b), modelKey, "the model key is in the sandbox's file %s", path)
		}
		return nil
	}))
	t.Logf("no model key in %d files of the sandbox tree", scanned)
	require.NotRegexp(t, `(?m)^(\.claude|\.codex|\.agents)/`, files, "no agent tooling scaffolding in the PR")

	// The console, while main is still the pristine demo repository.
	runBrowserTests(t, s)

	// Follow-ups from GitHub: a reader's @mention runs nothing; a
	// collaborator's "changes requested" review starts run 2 on the same
	// branch and pull request, resuming the agent's session.
	number := prURL[strings.LastIndex(prURL, "/")+1:]
	evs = append(evs, checkFollowUpFromReview(t, s, id, number, stream, &prev)...)
	// A follow-up over REST, on a Codex task of its own, which is then
	// cancelled in the console: its pull request is closed with a comment.
	checkFollowUpOverREST(t, s)

	// Merging on the forge sends the signed webhook: the task is done.
	code, body = s.do(t, http.MethodPut, s.forgeURL+"/repos/demo/greet/pulls/"+number+"/merge", "token "+s.forgeToken, `{}`)
	require.Equal(t, http.StatusOK, code, body)
	require.Eventually(t, func() bool {
		_, body := s.do(t, http.MethodGet, s.api+"/v1/tasks/"+id, bearer, "")
		return body["task"].(map[string]any)["status"] == "TASK_STATUS_DONE"
	}, 30*time.Second, 200*time.Millisecond)
	// The same stream pushes done, then ends.
	rest := until(t, stream, func(sseEvent) bool { return false })
	evs = append(evs, rest...)
	for _, e := range rest {
		n, err := strconv.Atoi(e.id)
		require.NoError(t, err)
		require.Equal(t, prev+1, n, "no gap or duplicate after awaiting_review")
		prev = n
	}
	tl := timelineOf(evs)
	require.Equal(t, []string{"status_change:PROPOSING/user:dev", "status_change:RUNNING/user:dev", "sandbox:started"}, tl[:3], "%v", tl)
	require.Equal(t, "status_change:DONE/github", tl[len(tl)-1], "the timeline ends at the merge: %v", tl)
	require.Contains(t, strings.Join(tl, " "), "completed status_change:AWAITING_REVIEW/runner", "%v", tl)
	require.Contains(t, strings.Join(tl, " "), "status_change:RUNNING/github:rita", "the review's run on the timeline: %v", tl)
	require.Contains(t, tl, "sandbox:destroyed", "the sandbox goes when the runner finishes: %v", tl)
	// Reconnecting after the end gets 204: EventSource stops, no loop.
	_, code = s.follow(t, id, strconv.Itoa(prev))
	require.Equal(t, http.StatusNoContent, code)

	checkTrace(t, s, traceID)
	checkMetrics(t, s)
	checkRedaction(t, s)
}

type jaegerSpan struct {
	TraceID       string `json:"traceID"`
	SpanID        string `json:"spanID"`
	OperationName string `json:"operationName"`
	References    []struct {
		RefType string `json:"refType"`
		TraceID string `json:"traceID"`
		SpanID  string `json:"spanID"`
	} `json:"references"`
	ProcessID string `json:"processID"`
}

type jaegerTrace struct {
	TraceID   string                    `json:"traceID"`
	Spans     []jaegerSpan              `json:"spans"`
	Processes map[string]map[string]any `json:"processes"`
}

// checkTrace reads the task's trace from Jaeger's HTTP query API: one trace
// holding spans of every process, with parent links across them.
func checkTrace(t *testing.T, s *stack, traceID string) {
	want := []string{"task.create", "dispatch", "sandbox.create", "runner", "stage.explore", "stage.propose", "stage.apply",
		"stage.archive", "git.clone", "git.push", "github.pr.create", "task.advance"}
	var tr jaegerTrace
	var missing []string
	require.Eventually(t, func() bool {
		resp, err := http.Get(s.jaegerURL + "/api/traces/" + traceID)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		var out struct {
			Data []jaegerTrace `json:"data"`
		}
		if json.NewDecoder(resp.Body).Decode(&out) != nil || len(out.Data) != 1 {
			return false
		}
		tr = out.Data[0]
		ops := map[string]bool{}
		for _, sp := range tr.Spans {
			ops[sp.OperationName] = true
		}
		missing = nil
		for _, w := range want {
			if !ops[w] {
				missing = append(missing, w)
			}
		}
		return len(missing) == 0
	}, 60*time.Second, 500*time.Millisecond, "trace %s misses spans %v", traceID, &missing)

	services := map[string]bool{}
	for _, p := range tr.Processes {
		services[fmt.Sprint(p["serviceName"])] = true
	}
	for _, svc := range []string{"gateway", "taskrunnerd", "runner"} {
		require.True(t, services[svc], "spans from %s in the trace (have %v)", svc, services)
	}
	byID := map[string]jaegerSpan{}
	byOp := map[string]jaegerSpan{}
	for _, sp := range tr.Spans {
		require.Equal(t, traceID, sp.TraceID)
		byID[sp.SpanID] = sp
		if _, ok := byOp[sp.OperationName]; !ok {
			byOp[sp.OperationName] = sp
		}
	}
	parent := func(op string) string {
		for _, r := range byOp[op].References {
			if r.RefType == "CHILD_OF" {
				return byID[r.SpanID].OperationName
			}
		}
		return ""
	}
	require.Equal(t, "sandbox.create", parent("runner"), "the runner continues the dispatch trace across processes")
	require.Equal(t, "runner", parent("stage.explore"))
	require.NotEmpty(t, parent("task.create"), "task.create has the gateway/gRPC request as parent")
	require.NotEqual(t, byOp["runner"].ProcessID, byOp["sandbox.create"].ProcessID, "parent and child live in different processes")
}

// metricValue sums the samples of a Prometheus metric whose labels contain
// every one of labels (e.g. `status="done"`).
func metricValue(t *testing.T, body, name string, labels ...string) float64 {
	var total float64
	found := false
	for _, l := range strings.Split(body, "\n") {
		if !strings.HasPrefix(l, name+"{") && !strings.HasPrefix(l, name+" ") {
			continue
		}
		match := true
		for _, lb := range labels {
			match = match && strings.Contains(l, lb)
		}
		if match {
			f := strings.Fields(l)
			v, err := strconv.ParseFloat(f[len(f)-1], 64)
			if err == nil {
				total += v
				found = true
			}
		}
	}
	require.True(t, found, "metric %s not exposed", name)
	return total
}

func checkMetrics(t *testing.T, s *stack) {
	get := func(url string) string {
		resp, err := http.Get(url)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	m := get("http://" + s.metricsAddr + "/metrics")
	require.GreaterOrEqual(t, metricValue(t, m, "taskrunner_tasks"), 1.0)
	require.GreaterOrEqual(t, metricValue(t, m, "taskrunner_tasks", `status="done"`), 1.0)
	require.Greater(t, metricValue(t, m, "taskrunner_events_ingested_total"), 10.0)
	require.GreaterOrEqual(t, metricValue(t, m, "taskrunner_dispatch_latency_seconds_count"), 1.0)
	metricValue(t, m, "taskrunner_queue_depth")
	g := get(s.api + "/metrics")
	metricValue(t, g, "taskrunner_sse_subscribers")
	metricValue(t, g, "taskrunner_sse_parked")
	metricValue(t, g, "taskrunner_sse_queued_bytes")
	metricValue(t, g, "taskrunner_sse_cut_off_total")
	// The stream parked above got the follow-up's events from its task's writer.
	require.Greater(t, metricValue(t, g, "taskrunner_sse_round_duration_seconds_count"), 0.0)
	// The process's cost, to divide by the streams.
	require.Greater(t, metricValue(t, g, "taskrunner_process_resident_memory_bytes"), 1e6)
	require.Greater(t, metricValue(t, g, "taskrunner_process_cpu_time_seconds_total"), 0.0)
	require.Greater(t, metricValue(t, g, "taskrunner_process_goroutines"), 1.0)
}

// dropTestState removes the database and the Redis keys the stack created.
func dropTestState(dbURL, redisPrefix string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if u, err := url.Parse(dbURL); err == nil {
		name := strings.TrimPrefix(u.Path, "/")
		u.Path = "/postgres"
		if conn, err := pgx.Connect(ctx, u.String()); err == nil {
			_, _ = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
			_ = conn.Close(ctx)
		}
	}
	if opts, err := redis.ParseURL(storetest.RedisURL()); err == nil {
		rdb := redis.NewClient(opts)
		defer rdb.Close()
		iter := rdb.Scan(ctx, 0, redisPrefix+"*", 1000).Iterator()
		for iter.Next(ctx) {
			rdb.Del(ctx, iter.Val())
		}
	}
}

// waitTask polls the task until ok holds and returns it.
func (s *stack) waitTask(t *testing.T, id string, ok func(map[string]any) bool) map[string]any {
	t.Helper()
	var task map[string]any
	require.Eventually(t, func() bool {
		code, body := s.do(t, http.MethodGet, s.api+"/v1/tasks/"+id, "Bearer "+s.token, "")
		if code != http.StatusOK {
			return false
		}
		task = body["task"].(map[string]any)
		return ok(task)
	}, 4*time.Minute, 250*time.Millisecond, "task %s: %v", id, &task)
	return task
}

func runsOf(task map[string]any) []map[string]any {
	raw, _ := task["runs"].([]any)
	out := make([]map[string]any, 0, len(raw))
	for _, r := range raw {
		out = append(out, r.(map[string]any))
	}
	return out
}

// checkFollowUpFromReview drives the forge as people would: a reader
// mentions @taskrunner, a collaborator requests changes.
func checkFollowUpFromReview(t *testing.T, s *stack, id, number string, stream <-chan sseEvent, prev *int) []sseEvent {
	forgeToken := "token " + s.forgeToken
	for user, perm := range map[string]string{"rita": "write", "rex": "read"} {
		code, body := s.do(t, http.MethodPut, s.forgeURL+"/_forge/repos/demo/greet/collaborators/"+user, forgeToken, `{"permission":"`+perm+`"}`)
		require.Equal(t, http.StatusNoContent, code, "%v", body)
	}
	headBefore := s.branchHead(t, id)

	code, body := s.do(t, http.MethodPost, s.forgeURL+"/_forge/as/rex/repos/demo/greet/issues/"+number+"/comments", "",
		`{"body":"@taskrunner please also add a --wave flag"}`)
	require.Equal(t, http.StatusCreated, code, "%v", body)
	code, body = s.do(t, http.MethodPost, s.forgeURL+"/_forge/as/rita/repos/demo/greet/pulls/"+number+"/reviews", "",
		`{"event":"REQUEST_CHANGES","body":"Please also accept -f as a short form of --farewell, and cover it in test.sh."}`)
	require.Equal(t, http.StatusOK, code, "%v", body)

	task := s.waitTask(t, id, func(tk map[string]any) bool {
		return tk["status"] == "TASK_STATUS_AWAITING_REVIEW" && fmt.Sprint(tk["run"]) == "2"
	})
	runs := runsOf(task)
	require.Len(t, runs, 2, "the reader's comment ran nothing; the review ran once: %v", runs)
	require.Equal(t, "review", runs[1]["trigger"])
	require.Equal(t, "github:rita", runs[1]["requested_by"])
	require.Contains(t, runs[1]["prompt"], "short form of --farewell")
	require.Equal(t, "finished", runs[1]["state"])

	// The same stream (still open) showed run 2, and the same PR.
	evs := until(t, stream, func(e sseEvent) bool {
		return statusTo(e) == "TASK_STATUS_AWAITING_REVIEW" && fmt.Sprint(e.data["status_change"].(map[string]any)["run"]) == "2"
	})
	var stages []string
	for _, e := range evs {
		n, err := strconv.Atoi(e.id)
		require.NoError(t, err)
		require.Equal(t, *prev+1, n, "no gap or duplicate across runs")
		*prev = n
		switch e.name {
		case "stage_change":
			stages = append(stages, e.data["stage_change"].(map[string]any)["stage"].(string))
		case "completed":
			require.True(t, strings.HasSuffix(e.data["completed"].(map[string]any)["pr_url"].(string), "/pull/"+number), "the same pull request")
		}
	}
	require.Equal(t, []string{"TASK_STAGE_PROPOSE", "TASK_STAGE_APPLY", "TASK_STAGE_ARCHIVE"}, stages, "a revision's stages")

	// A new commit on the same branch, on top of run 1's, implementing the review.
	head := s.branchHead(t, id)
	require.NotEqual(t, headBefore, head)
	require.Equal(t, headBefore, strings.TrimSpace(s.git(t, "rev-parse", head+"^")), "run 2's commit follows run 1's")
	require.Contains(t, s.git(t, "show", head+":greet"), "-f | --farewell)")
	// The pull request has the run's comment.
	code, raw := s.doRaw(t, http.MethodGet, s.forgeURL+"/repos/demo/greet/issues/"+number+"/comments", forgeToken)
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, raw, "taskrunner run 2")
	return evs
}

// checkFollowUpOverREST runs a Codex task to its PR, asks for a follow-up
// over REST (idempotent by Idempotency-Key), then cancels the task in the
// console (runBrowserCancelReview: the warning naming its pull request is
// on screen before the click) and checks over REST that the task is
// cancelled and its pull request closed with a comment.
func checkFollowUpOverREST(t *testing.T, s *stack) {
	bearer := "Bearer " + s.token
	code, body := s.do(t, http.MethodPost, s.api+"/v1/tasks", bearer, `{"repo":"demo/greet","prompt":"Add a --farewell flag to greet","agent":"AGENT_CODEX","dispatch":true}`)
	require.Equal(t, http.StatusOK, code, "%v", body)
	id := body["task"].(map[string]any)["id"].(string)
	task := s.waitTask(t, id, func(tk map[string]any) bool { return tk["status"] != "TASK_STATUS_RUNNING" })
	require.Equal(t, "TASK_STATUS_AWAITING_REVIEW", task["status"], "%v", task)
	pr := task["pr_url"].(string)

	// Refused with a clear 4xx without a prompt.
	code, body = s.do(t, http.MethodPost, s.api+"/v1/tasks/"+id+":followup", bearer, `{"prompt":" "}`)
	require.Equal(t, http.StatusBadRequest, code, "%v", body)
	followUp := func() (int, map[string]any) {
		req, _ := http.NewRequest(http.MethodPost, s.api+"/v1/tasks/"+id+":followup", strings.NewReader(`{"prompt":"Please also accept -f as a short form of --farewell."}`))
		req.Header.Set("Authorization", bearer)
		req.Header.Set("Idempotency-Key", "codex-followup-1")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		var out map[string]any
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
		return resp.StatusCode, out
	}
	code, body = followUp()
	require.Equal(t, http.StatusOK, code, "%v", body)
	require.Equal(t, true, body["created"])
	require.Equal(t, float64(2), body["run"].(map[string]any)["number"])
	code, body = followUp()
	require.Equal(t, http.StatusOK, code, "%v", body)
	require.NotEqual(t, true, body["created"], "the same Idempotency-Key starts nothing twice")

	task = s.waitTask(t, id, func(tk map[string]any) bool {
		return fmt.Sprint(tk["run"]) == "2" && tk["status"] != "TASK_STATUS_RUNNING" && tk["status"] != "TASK_STATUS_QUEUED"
	})
	require.Equal(t, "TASK_STATUS_AWAITING_REVIEW", task["status"], "%v", task)
	require.Equal(t, pr, task["pr_url"], "the same pull request")
	require.Len(t, runsOf(task), 2)

	// Cancel, from the task's page in the console, closes the pull request,
	// with a comment naming who cancelled.
	runBrowserCancelReview(t, s, id)
	code, body = s.do(t, http.MethodGet, s.api+"/v1/tasks/"+id, bearer, "")
	require.Equal(t, http.StatusOK, code, "%v", body)
	require.Equal(t, "TASK_STATUS_CANCELLED", body["task"].(map[string]any)["status"])
	number := pr[strings.LastIndex(pr, "/")+1:]
	code, got := s.do(t, http.MethodGet, s.forgeURL+"/repos/demo/greet/pulls/"+number, "token "+s.forgeToken, "")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "closed", got["state"])
	code, raw := s.doRaw(t, http.MethodGet, s.forgeURL+"/repos/demo/greet/issues/"+number+"/comments", "token "+s.forgeToken)
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, raw, "cancelled by dev")
}

func (s *stack) doRaw(t *testing.T, method, url, auth string) (int, string) {
	req, err := http.NewRequest(method, url, nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", auth)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// git runs git against a fresh clone of demo/greet (made on first use).
func (s *stack) git(t *testing.T, args ...string) string {
	t.Helper()
	if s.clone == "" {
		s.clone = filepath.Join(t.TempDir(), "greet-follow")
		out, err := exec.Command("git", "-c", "http.extraHeader=Authorization: token "+s.forgeToken, "clone", "-q", s.forgeURL+"/demo/greet.git", s.clone).CombinedOutput()
		require.NoError(t, err, string(out))
	}
	cmd := exec.Command("git", append([]string{"-c", "http.extraHeader=Authorization: token " + s.forgeToken}, args...)...)
	cmd.Dir = s.clone
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, string(out))
	return string(out)
}

// branchHead is the commit the task's branch points at on the forge.
func (s *stack) branchHead(t *testing.T, id string) string {
	s.git(t, "fetch", "-q", "origin", "taskrunner/"+id)
	return strings.TrimSpace(s.git(t, "rev-parse", "FETCH_HEAD"))
}

// modelKey is the model API key devstack gives taskrunnerd (the offline
// demo's); only the control plane's model proxy may hold it.
const modelKey = "offline-demo-key"

// keyWatch scans every process's environment while a task runs.
type keyWatch struct {
	stop    chan struct{}
	done    chan struct{}
	mu      sync.Mutex
	sandbox map[int]string // pids of the task's sandbox, with their command
	leaks   []string
}

// watchForModelKeys records the task's sandbox processes (their
// environment names the task, or they descend from such a process) and
// those whose environment holds the model key.
func watchForModelKeys(t *testing.T, taskID string) *keyWatch {
	w := &keyWatch{stop: make(chan struct{}), done: make(chan struct{}), sandbox: map[int]string{}}
	go func() {
		defer close(w.done)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			w.scan(taskID)
			select {
			case <-w.stop:
				return
			case <-tick.C:
			}
		}
	}()
	t.Cleanup(w.halt)
	return w
}

func (w *keyWatch) halt() {
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
	<-w.done
}

func (w *keyWatch) scan(taskID string) {
	dirs, _ := os.ReadDir("/proc")
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		env, err := os.ReadFile(filepath.Join("/proc", d.Name(), "environ"))
		if err != nil {
			continue
		}
		cmd, _ := os.ReadFile(filepath.Join("/proc", d.Name(), "cmdline"))
		name := strings.ReplaceAll(string(cmd), "\x00", " ")
		ppid := parentOf(pid)
		w.mu.Lock()
		_, parentIn := w.sandbox[ppid]
		if strings.Contains(string(env), "TASKRUNNER_TASK_ID="+taskID) || parentIn {
			w.sandbox[pid] = name
		}
		if _, in := w.sandbox[pid]; in && strings.Contains(string(env), modelKey) {
			w.leaks = append(w.leaks, fmt.Sprintf("pid %d (%s)", pid, name))
		}
		w.mu.Unlock()
	}
}

func parentOf(pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// pid (comm) state ppid …: comm may hold spaces, so split after ")".
	rest := string(b[strings.LastIndexByte(string(b), ')')+1:])
	f := strings.Fields(rest)
	if len(f) < 2 {
		return 0
	}
	ppid, _ := strconv.Atoi(f[1])
	return ppid
}

// check stops the watch and asserts that it saw the sandbox's runner and
// agent and the key in none of the sandbox's processes.
func (w *keyWatch) check(t *testing.T, agent string) {
	t.Helper()
	w.halt()
	w.mu.Lock()
	defer w.mu.Unlock()
	var names []string
	for _, n := range w.sandbox {
		names = append(names, n)
	}
	joined := strings.Join(names, "\n")
	require.Contains(t, joined, "runner", "the watch saw the sandbox's runner")
	require.Contains(t, joined, agent, "the watch saw the agent CLI")
	require.Empty(t, w.leaks, "the model key is in the sandbox's processes")
}
