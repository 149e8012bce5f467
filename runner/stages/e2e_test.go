package stages_test

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/taskrunner/taskrunner/platform/redact"
	"github.com/taskrunner/taskrunner/runner/agent"
	"github.com/taskrunner/taskrunner/runner/agent/claude"
	"github.com/taskrunner/taskrunner/runner/agent/codex"
	"github.com/taskrunner/taskrunner/runner/proc"
	"github.com/taskrunner/taskrunner/runner/repotoken"
	"github.com/taskrunner/taskrunner/runner/stages"
	"github.com/taskrunner/taskrunner/runner/workspace"
	"github.com/taskrunner/taskrunner/tools/forge"
	"github.com/taskrunner/taskrunner/tools/modelapi"

	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
)

const (
	owner       = "acme"
	repoName    = "greet"
	demoPrompt  = "Add a --farewell flag to greet"
	demoChange  = "add-farewell"
	traceID     = "4bf92f3577b34da6a3ce929d0e0e4736"
	traceParent = "00-" + traceID + "-00f067aa0ba902b7-01"
	openAIKey   = "sk-openai-test-key-0123456789abcdef"
)

var appKey = sync.OnceValue(func() *rsa.PrivateKey {
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		panic(err)
	}
	return k
})

// fakeReporter records events in memory and delivers a Cancel on demand.
type fakeReporter struct {
	mu     sync.Mutex
	events []*taskrunnerv1.Event
	cancel chan string
}

func newFakeReporter() *fakeReporter { return &fakeReporter{cancel: make(chan string, 1)} }

func (f *fakeReporter) Send(ev *taskrunnerv1.Event) (int64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	e := proto.Clone(ev).(*taskrunnerv1.Event)
	e.Seq = int64(len(f.events) + 1)
	f.events = append(f.events, e)
	return e.Seq, nil
}

func (f *fakeReporter) Cancelled() <-chan string { return f.cancel }

func (f *fakeReporter) Events() []*taskrunnerv1.Event {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*taskrunnerv1.Event(nil), f.events...)
}

// logged tells whether any log line so far contains s.
func (f *fakeReporter) logged(s string) bool {
	for _, ev := range f.Events() {
		for _, l := range ev.GetLog().GetLines() {
			if strings.Contains(l, s) {
				return true
			}
		}
	}
	return false
}

// kinds lists the non-log events as short names.
func kinds(evs []*taskrunnerv1.Event) []string {
	var out []string
	for _, ev := range evs {
		switch p := ev.GetPayload().(type) {
		case *taskrunnerv1.Event_Log:
		case *taskrunnerv1.Event_StageChange:
			out = append(out, "stage:"+stages.StageName(p.StageChange.GetStage()))
		case *taskrunnerv1.Event_DiffStats:
			out = append(out, "diff_stats")
		case *taskrunnerv1.Event_Usage:
			out = append(out, "usage")
		case *taskrunnerv1.Event_Completed:
			out = append(out, "completed")
		case *taskrunnerv1.Event_Failed:
			out = append(out, "failed")
		case *taskrunnerv1.Event_Cancelled:
			out = append(out, "cancelled")
		}
	}
	return out
}

func last[T any](evs []*taskrunnerv1.Event, get func(*taskrunnerv1.Event) T, ok func(*taskrunnerv1.Event) bool) T {
	var out T
	for _, ev := range evs {
		if ok(ev) {
			out = get(ev)
		}
	}
	return out
}

// forgeTokens mints installation tokens of the forge, like GitHubTokenService would.
type forgeTokens struct {
	f      *forge.Forge
	url    string
	repo   string
	scope  []string
	mu     sync.Mutex
	minted []string
}

func (s *forgeTokens) Token(context.Context) (repotoken.Token, error) {
	text, _, exp, err := s.f.MintInstallationToken(owner, s.scope, map[string]string{"contents": "write", "pull_requests": "write"})
	if err != nil {
		return repotoken.Token{}, err
	}
	s.mu.Lock()
	s.minted = append(s.minted, text)
	s.mu.Unlock()
	return repotoken.Token{Value: text, Expiry: exp, Repo: s.repo, APIBaseURL: s.url, GitBaseURL: s.url}, nil
}

// staticToken hands out a fixed token.
type staticToken repotoken.Token

func (s staticToken) Token(context.Context) (repotoken.Token, error) { return repotoken.Token(s), nil }

type slogTestWriter struct{ t *testing.T }

func (w slogTestWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(b), "\n"))
	return len(b), nil
}

// Agents the tests run, by their TASKRUNNER_AGENT name (also the name of their CLI).
const (
	agentClaude = "claude"
	agentCodex  = "codex"
)

// codexPrices price the Codex demo's tokens (distinct from the defaults on purpose).
var codexPrices = codex.Prices{InputPerMTok: 2, CachedInputPerMTok: 0.5, OutputPerMTok: 8}

// nodeBin finds node_modules/.bin with the agent's CLI and openspec above the test.
func nodeBin(t *testing.T, cli string) string {
	dir, err := os.Getwd()
	require.NoError(t, err)
	for {
		bin := filepath.Join(dir, "node_modules", ".bin")
		if _, err := os.Stat(filepath.Join(bin, cli)); err == nil {
			if _, err := os.Stat(filepath.Join(bin, "openspec")); err == nil {
				return bin
			}
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			break
		}
		dir = parent
	}
	if os.Getenv("TASKRUNNER_REQUIRE_AGENTS") == "1" {
		t.Fatalf("TASKRUNNER_REQUIRE_AGENTS=1 but the %s and openspec CLIs are not installed (run `npm ci` at the repository root)", cli)
	}
	t.Skipf("the %s and openspec CLIs are not installed: no node_modules/.bin above this directory (run `npm ci` at the repository root)", cli)
	return ""
}

type harness struct {
	t        *testing.T
	forge    *forge.Forge
	forgeTS  *httptest.Server
	model    *modelapi.Server
	modelURL string
	rep      *fakeReporter
	tokens   repotoken.Source
	opts     stages.Options
	taskID   string
	minted   *forgeTokens
}

type setup struct {
	agent    string // agentClaude (default) or agentCodex
	script   string
	repo     string // repository the task names (default acme/greet)
	files    map[string]string
	maxTurns int
	tokens   func(h *harness) repotoken.Source
	patterns []string
	budget   float64 // TASKRUNNER_MAX_BUDGET_USD
}

func newHarness(t *testing.T, s setup) *harness {
	t.Helper()
	if s.agent == "" {
		s.agent = agentClaude
	}
	nodeBin(t, s.agent)
	if s.repo == "" {
		s.repo = owner + "/" + repoName
	}
	if s.maxTurns == 0 {
		s.maxTurns = 20
	}
	f, err := forge.New(forge.Config{DataDir: t.TempDir(), AppID: 7, AppPublicKey: &appKey().PublicKey})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, f.Close()) })
	if s.files != nil {
		require.NoError(t, f.CreateRepo(owner, repoName, s.files))
	} else {
		require.NoError(t, f.SeedFromDir(owner, repoName, "../../tools/demo/sample-repo"))
	}
	fts := httptest.NewServer(f.Handler())
	t.Cleanup(fts.Close)

	script, err := modelapi.LoadScript(s.script)
	require.NoError(t, err)
	model := modelapi.New(script, slog.New(slog.NewTextHandler(slogTestWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn})))
	mts := httptest.NewServer(model)
	t.Cleanup(mts.Close)

	taskID := strings.ReplaceAll(strings.ToLower(t.Name()), "/", "-")
	taskID = strings.NewReplacer("_", "-").Replace(taskID)
	h := &harness{t: t, forge: f, forgeTS: fts, model: model, modelURL: mts.URL, rep: newFakeReporter(), taskID: taskID}
	h.minted = &forgeTokens{f: f, url: fts.URL, repo: s.repo, scope: []string{repoName}}
	h.tokens = h.minted
	if s.tokens != nil {
		h.tokens = s.tokens(h)
	}
	h.opts = h.sandbox(s, false)
	return h
}

// sandbox prepares a new sandbox for the task (a new work directory, agent HOME and
// checkout), as every run gets, and returns the options of a run in it.
func (h *harness) sandbox(s setup, followUp bool) stages.Options {
	t := h.t
	bin := nodeBin(t, s.agent)
	// Not t.TempDir: its parent is 0700 and the unprivileged agent could not reach the checkout.
	root, err := os.MkdirTemp("", "runner-stages-")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(root) })
	require.NoError(t, os.Chmod(root, 0o755))
	var user *proc.User
	if os.Geteuid() == 0 {
		user = &proc.User{Uid: 65534, Gid: 65534, Groups: []uint32{}}
	}
	home, repo, err := stages.PrepareDirs(filepath.Join(root, "task"), user)
	require.NoError(t, err)
	red, err := redact.New(s.patterns)
	require.NoError(t, err)
	environ := []string{"PATH=" + os.Getenv("PATH"), "ANTHROPIC_BASE_URL=" + h.modelURL, "ANTHROPIC_API_KEY=sk-ant-test-key-0123456789abcdef"}
	red.AddLiteral("sk-ant-test-key-0123456789abcdef")
	red.AddLiteral(openAIKey)
	extra := []string{bin}
	var ag agent.Agent
	switch s.agent {
	case agentCodex:
		ag = codex.New(codex.Config{
			Bin: filepath.Join(bin, "codex"), Dir: repo, Home: filepath.Join(home, ".codex"),
			Env: stages.AgentEnv(environ, home, extra, false), User: user,
			BaseURL: h.modelURL + "/v1", APIKey: openAIKey, Prices: codexPrices, MaxBudgetUSD: s.budget, Retries: -1,
		})
	default:
		ag = claude.New(claude.Config{
			Bin: filepath.Join(bin, "claude"), Dir: repo, Env: stages.AgentEnv(environ, home, extra, false),
			User: user, MaxTurns: s.maxTurns, MaxBudgetUSD: s.budget,
		})
	}
	return stages.Options{
		Task:     stages.Task{ID: h.taskID, Repo: s.repo, BaseBranch: "main", Prompt: demoPrompt, TraceParent: traceParent, MaxBudgetUSD: s.budget},
		Reporter: h.rep,
		Tokens:   h.tokens,
		Agent:    ag,
		Workspace: workspace.New(workspace.Config{
			Dir: repo, Env: stages.BaseEnv(environ, home, extra), User: user, TaskID: h.taskID, BaseBranch: "main", FollowUp: followUp,
		}),
		OpenSpecBin:  filepath.Join(bin, "openspec"),
		OpenSpecTool: s.agent,
		Redactor:     red,
		Logger:       slog.New(slog.NewTextHandler(slogTestWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo})),
		HTTPClient:   h.forgeTS.Client(),
	}
}

func (h *harness) run(ctx context.Context) stages.Outcome {
	h.t.Helper()
	start := time.Now()
	out := stages.Run(ctx, h.opts)
	h.t.Logf("run took %s: %s %q %s", time.Since(start).Round(time.Millisecond), out.Status, out.Reason, out.PRURL)
	return out
}

// git runs git on the forge's bare repository.
func (h *harness) git(args ...string) string {
	h.t.Helper()
	dir, ok := h.forge.RepoDir(owner, repoName)
	require.True(h.t, ok)
	cmd := exec.Command("git", append([]string{"--git-dir=" + dir}, args...)...)
	cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL="+os.DevNull)
	out, err := cmd.CombinedOutput()
	require.NoError(h.t, err, "git %v: %s", args, out)
	return string(out)
}

// noProcess asserts that no process runs with needle in its command line.
func noProcess(t *testing.T, needle string) {
	t.Helper()
	cmdlines, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range cmdlines {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		cl := strings.ReplaceAll(string(b), "\x00", " ")
		require.NotContains(t, cl, needle, "process %s still runs", p)
	}
}

// eventsJSON is every event as JSON, for secret checks.
func eventsJSON(t *testing.T, evs []*taskrunnerv1.Event) string {
	var b strings.Builder
	for _, ev := range evs {
		j, err := protojson.Marshal(ev)
		require.NoError(t, err)
		b.Write(j)
		b.WriteByte('\n')
	}
	return b.String()
}

// recordedTotals reads the real CLI's recorded output of the demo: the session cost after the
// last stage and the tokens summed over the stages.
func recordedTotals(t *testing.T, agentName string) (cost float64, in, out int64) {
	if agentName == agentCodex {
		return recordedCodexTotals(t)
	}
	for _, stage := range []string{"explore", "propose", "apply", "archive"} {
		b, err := os.ReadFile(filepath.Join("../../tools/modelapi/testdata/recorded", stage+".jsonl"))
		require.NoError(t, err)
		for _, line := range strings.Split(string(b), "\n") {
			if line == "" {
				continue
			}
			m, err := claude.ParseLine([]byte(line))
			require.NoError(t, err)
			if m.Result != nil {
				cost = m.Result.TotalCostUSD
				in += m.Result.InputTokens
				out += m.Result.OutputTokens
			}
		}
	}
	return cost, in, out
}

// recordedCodexTotals reads the real Codex CLI's recorded JSONL of the demo: a resumed thread's
// turn.completed is cumulative, so the last stage's usage is the whole task's, priced with
// codexPrices.
func recordedCodexTotals(t *testing.T) (cost float64, in, out int64) {
	b, err := os.ReadFile("../agent/codex/testdata/recorded/archive.jsonl")
	require.NoError(t, err)
	var u *codex.Usage
	for _, line := range strings.Split(string(b), "\n") {
		if line == "" {
			continue
		}
		ev, err := codex.ParseLine([]byte(line))
		require.NoError(t, err)
		if ev.Usage != nil {
			u = ev.Usage
		}
	}
	require.NotNil(t, u)
	return codexPrices.Cost(*u), u.InputTokens, u.OutputTokens
}

// demoScript is each agent's demo script; initFile a file `openspec init --tools <agent>` writes.
var demo = map[string]struct{ script, initFile string }{
	agentClaude: {"../../tools/demo/claude-demo.yaml", ".claude/commands/opsx/apply.md"},
	agentCodex:  {"../../tools/demo/codex-demo.yaml", ".agents/skills/openspec-apply-change/SKILL.md"},
}

func TestEndToEndDemo(t *testing.T) {
	t.Parallel()
	for _, agentName := range []string{agentClaude, agentCodex} {
		t.Run(agentName, func(t *testing.T) {
			t.Parallel()
			testEndToEndDemo(t, agentName)
		})
	}
}

func testEndToEndDemo(t *testing.T, agentName string) {
	h := newHarness(t, setup{agent: agentName, script: demo[agentName].script})
	out := h.run(context.Background())
	require.Equal(t, stages.StatusCompleted, out.Status, out.Reason)

	// The forge has the PR from the task branch.
	prs := h.forge.PullRequests(owner + "/" + repoName)
	require.Len(t, prs, 1)
	p := prs[0]
	branch := "taskrunner/" + h.taskID
	require.Equal(t, branch, p.Head)
	require.Equal(t, "main", p.Base)
	require.False(t, p.Draft)
	require.Equal(t, demoChange, p.Title, "the demo proposal's heading is the generic 'Proposal'")
	require.Contains(t, p.Body, "`greet` can only say hello.")
	require.Contains(t, p.Body, "Trace id: `"+traceID+"`")
	require.Contains(t, p.Body, "| archive |")
	require.Equal(t, h.forgeTS.URL+"/acme/greet/pull/1", out.PRURL)
	require.EqualValues(t, 1, out.PRNumber)

	// The branch holds the code edit and the archived change.
	require.Contains(t, h.git("show", branch+":greet"), `greeting="Goodbye"`)
	files := h.git("ls-tree", "-r", "--name-only", branch)
	require.Regexp(t, `openspec/changes/archive/\d{4}-\d{2}-\d{2}-add-farewell/proposal\.md`, files)
	require.Contains(t, files, "openspec/specs/greet/spec.md")
	require.NotContains(t, files, "openspec/changes/add-farewell/")
	require.NotContains(t, files, demo[agentName].initFile, "what openspec init writes for the agent stays out of the PR")
	require.NotContains(t, files, "openspec/config.yaml", "what openspec init writes stays out of the PR")
	require.NotRegexp(t, `(?m)^\.(claude|codex|agents)/`, files)
	require.Equal(t, "taskrunner", strings.TrimSpace(h.git("log", "-1", "--format=%an", branch)))
	require.Contains(t, h.git("log", "-1", "--format=%B", branch), "Task: "+h.taskID)

	// The events, in order.
	evs := h.rep.Events()
	require.Equal(t, []string{
		"stage:explore", "usage", "stage:propose", "usage", "stage:apply", "usage", "diff_stats",
		"stage:archive", "diff_stats", "usage", "completed",
	}, kinds(evs))
	var changes []string
	for _, ev := range evs {
		if sc := ev.GetStageChange(); sc != nil {
			changes = append(changes, sc.GetChange())
		}
	}
	require.Equal(t, []string{"", "", demoChange, demoChange}, changes)

	want := workspace.ParseNumstat(h.git("diff", "--numstat", "main", branch))
	require.Positive(t, want.Additions)
	ds := last(evs, (*taskrunnerv1.Event).GetDiffStats, func(e *taskrunnerv1.Event) bool { return e.GetDiffStats() != nil })
	require.Equal(t, want.Additions, ds.GetAdditions())
	require.Equal(t, want.Deletions, ds.GetDeletions())
	require.Equal(t, want.FilesChanged, ds.GetFilesChanged())

	cost, in, outTok := recordedTotals(t, agentName)
	u := last(evs, (*taskrunnerv1.Event).GetUsage, func(e *taskrunnerv1.Event) bool { return e.GetUsage() != nil })
	require.Positive(t, cost)
	require.InDelta(t, cost, u.GetCostUsd(), 1e-9)
	require.Equal(t, in, u.GetTokensIn())
	require.Equal(t, outTok, u.GetTokensOut())

	c := evs[len(evs)-1].GetCompleted()
	require.Equal(t, out.PRURL, c.GetPrUrl())
	require.EqualValues(t, 1, c.GetPrNumber())

	// Log tails arrived, and no token or key left the runner.
	require.True(t, h.rep.logged("> Edit greet"))
	all := eventsJSON(t, evs)
	for _, tok := range h.minted.minted {
		require.NotContains(t, all, tok)
	}
	require.NotContains(t, all, "sk-ant-test-key")
	require.NotContains(t, all, openAIKey)
	noProcess(t, h.opts.Workspace.Dir())
}

func TestFailures(t *testing.T) {
	t.Parallel()
	bogus := "ghs_" + strings.Repeat("Zx9", 12)
	cases := []struct {
		name      string
		setup     setup
		prompt    string
		trigger   func(h *harness, expired chan struct{}) // acts once the agent hangs
		hangsOn   string
		status    stages.Status
		reason    []string
		draftWith string // a file the draft PR's branch must hold; "" = no PR
		deadline  time.Time
	}{
		{
			name:     "deadline already passed",
			setup:    setup{script: "../../tools/demo/claude-demo.yaml"},
			deadline: time.Now().Add(-time.Second),
			status:   stages.StatusFailed,
			reason:   []string{"timeout"},
		},
		{
			name:   "model API error",
			setup:  setup{script: "testdata/api-error.yaml"},
			status: stages.StatusFailed,
			reason: []string{"explore stage: claude:", "scripted upstream failure"},
		},
		{
			name:      "turn cap",
			setup:     setup{script: "testdata/endless.yaml", maxTurns: 2},
			status:    stages.StatusFailed,
			reason:    []string{"turn cap reached", "error_max_turns"},
			draftWith: "notes.md",
		},
		{
			name:      "deadline mid-stage",
			setup:     setup{script: "testdata/hang.yaml"},
			prompt:    "4242 wait",
			hangsOn:   "> Bash: sleep 4242",
			trigger:   func(_ *harness, expired chan struct{}) { close(expired) },
			status:    stages.StatusFailed,
			reason:    []string{"timeout"},
			draftWith: "partial.txt",
		},
		{
			name:    "cancel",
			setup:   setup{script: "testdata/hang.yaml"},
			prompt:  "4343 wait",
			hangsOn: "> Bash: sleep 4343",
			trigger: func(h *harness, _ chan struct{}) { h.rep.cancel <- "user pressed cancel" },
			status:  stages.StatusCancelled,
			reason:  []string{"user pressed cancel"},
		},
		{
			name:   "codex turn failed",
			setup:  setup{agent: agentCodex, script: "testdata/codex-turn-failed.yaml"},
			status: stages.StatusFailed,
			reason: []string{"explore stage: codex: turn failed:", "scripted stream failure"},
		},
		{
			name:   "codex HTTP error",
			setup:  setup{agent: agentCodex, script: "testdata/codex-http-error.yaml"},
			status: stages.StatusFailed,
			reason: []string{"explore stage: codex: turn failed: invalid_request_error: scripted bad request"},
		},
		{
			name:      "codex deadline mid-stage",
			setup:     setup{agent: agentCodex, script: "testdata/codex-hang.yaml"},
			prompt:    "4444 wait",
			hangsOn:   "> Bash: sleep 4444",
			trigger:   func(_ *harness, expired chan struct{}) { close(expired) },
			status:    stages.StatusFailed,
			reason:    []string{"timeout"},
			draftWith: "partial.txt",
		},
		{
			name:    "codex cancel",
			setup:   setup{agent: agentCodex, script: "testdata/codex-hang.yaml"},
			prompt:  "4545 wait",
			hangsOn: "> Bash: sleep 4545",
			trigger: func(h *harness, _ chan struct{}) { h.rep.cancel <- "user pressed cancel" },
			status:  stages.StatusCancelled,
			reason:  []string{"user pressed cancel"},
		},
		{
			name:   "codex exits non-zero",
			setup:  setup{agent: agentCodex, script: "testdata/codex-exit.yaml"},
			status: stages.StatusFailed,
			reason: []string{"explore stage: codex: killed by signal 15 (terminated)"},
		},
		{
			name:      "codex budget exceeded",
			setup:     setup{agent: agentCodex, script: "testdata/codex-budget.yaml", budget: 0.05},
			status:    stages.StatusFailed,
			reason:    []string{"explore stage: codex: budget exceeded (token cost 0.0560 USD of 0.0500 USD)"},
			draftWith: "notes.md",
		},
		{
			name: "token refused",
			setup: setup{script: "../../tools/demo/claude-demo.yaml", tokens: func(h *harness) repotoken.Source {
				return staticToken{Value: bogus, Expiry: time.Now().Add(time.Hour), Repo: "acme/greet", APIBaseURL: h.forgeTS.URL, GitBaseURL: h.forgeTS.URL}
			}},
			status: stages.StatusFailed,
			reason: []string{"authentication failed"},
		},
		{
			name:   "repository does not exist",
			setup:  setup{script: "../../tools/demo/claude-demo.yaml", repo: "acme/missing", tokens: func(h *harness) repotoken.Source { h.minted.scope = nil; return h.minted }},
			status: stages.StatusFailed,
			reason: []string{"clone acme/missing: repository not found"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, tc.setup)
			if tc.prompt != "" {
				h.opts.Task.Prompt = tc.prompt
			}
			h.opts.Task.Deadline = tc.deadline
			expired := make(chan struct{})
			h.opts.Expired = expired
			done := make(chan stages.Outcome, 1)
			go func() { done <- h.run(context.Background()) }()
			if tc.trigger != nil {
				require.Eventually(t, func() bool { return h.rep.logged(tc.hangsOn) }, 2*time.Minute, 50*time.Millisecond)
				tc.trigger(h, expired)
			}
			var out stages.Outcome
			select {
			case out = <-done:
			case <-time.After(3 * time.Minute):
				t.Fatal("the runner did not stop")
			}
			require.Equal(t, tc.status, out.Status, out.Reason)
			for _, r := range tc.reason {
				require.Contains(t, out.Reason, r)
			}
			require.NotContains(t, out.Reason, bogus)
			require.LessOrEqual(t, len(out.Reason), stages.MaxReasonBytes)

			evs := h.rep.Events()
			require.NotEmpty(t, evs)
			term := evs[len(evs)-1]
			switch tc.status {
			case stages.StatusFailed:
				require.Equal(t, out.Reason, term.GetFailed().GetReason())
				require.Equal(t, out.PRURL, term.GetFailed().GetPrUrl())
			case stages.StatusCancelled:
				require.Equal(t, out.Reason, term.GetCancelled().GetReason())
			}
			require.NotContains(t, eventsJSON(t, evs), bogus)

			prs := h.forge.PullRequests(owner + "/" + repoName)
			if tc.draftWith == "" {
				require.Empty(t, prs)
				require.Empty(t, out.PRURL)
			} else {
				require.Len(t, prs, 1)
				require.True(t, prs[0].Draft)
				require.True(t, strings.HasPrefix(prs[0].Title, "[incomplete] "), prs[0].Title)
				require.Contains(t, prs[0].Body, "Incomplete")
				require.Equal(t, fmt.Sprintf("%s/acme/greet/pull/%d", h.forgeTS.URL, prs[0].Number), out.PRURL)
				require.Contains(t, h.git("ls-tree", "-r", "--name-only", prs[0].Head), tc.draftWith)
			}
			if tc.hangsOn != "" {
				noProcess(t, strings.TrimPrefix(tc.hangsOn, "> Bash: "))
			}
			noProcess(t, h.opts.Workspace.Dir())
		})
	}
}

func TestRedactsWhatTheAgentPrints(t *testing.T) {
	t.Parallel()
	ghp := "ghp_" + strings.Repeat("a1B2", 9)
	custom := "CUSTOM-SECRET-271828"
	pem := "-----BEGIN EC PRIVATE KEY-----\nMHcCAQEEIBkg4LVWM9nuwNSk3yByxZpYRTBnVJk5oIh8HpXBPGyhoAoGCCqGSM49\n-----END EC PRIVATE KEY-----"
	h := newHarness(t, setup{
		script:   "testdata/leak.yaml",
		files:    map[string]string{"README.md": "# greet\n", "secret.txt": "github: " + ghp + "\ncustom: " + custom + "\n" + pem + "\n"},
		patterns: []string{`CUSTOM-SECRET-[0-9]+`},
	})
	out := h.run(context.Background())
	require.Equal(t, stages.StatusFailed, out.Status)
	require.Contains(t, out.Reason, "scripted stop after explore")

	evs := h.rep.Events()
	require.True(t, h.rep.logged("> Bash: cat secret.txt"))
	require.True(t, h.rep.logged("github: "+redact.Mask), "the file's text reached the log, redacted")
	all := eventsJSON(t, evs)
	for _, secret := range []string{ghp, custom, "MHcCAQEEIBkg4LVWM9nuwNSk3yByxZpYRTBnVJk5oIh8HpXBPGyhoAoGCCqGSM49", "sk-ant-test-key"} {
		require.NotContains(t, all, secret)
	}
}
