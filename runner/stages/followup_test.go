package stages_test

import (
	"context"
	"log/slog"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-github/v62/github"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
	"github.com/taskrunner/taskrunner/runner/session"
	"github.com/taskrunner/taskrunner/runner/stages"
	"github.com/taskrunner/taskrunner/runner/workspace"
	"github.com/taskrunner/taskrunner/tools/modelapi"
)

// memSessions keeps saved sessions the way the Events service does: the newest per task.
type memSessions struct {
	mu    sync.Mutex
	saved []*taskrunnerv1.SaveSessionRequest
}

func (m *memSessions) SaveSession(_ context.Context, req *taskrunnerv1.SaveSessionRequest) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.saved = append(m.saved, proto.Clone(req).(*taskrunnerv1.SaveSessionRequest))
	return nil
}

func (m *memSessions) LoadSession(context.Context) (*taskrunnerv1.LoadSessionResponse, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.saved) == 0 {
		return &taskrunnerv1.LoadSessionResponse{}, nil
	}
	s := m.saved[len(m.saved)-1]
	return &taskrunnerv1.LoadSessionResponse{Found: true, Run: s.GetRun(), Agent: s.GetAgent(), SessionId: s.GetSessionId(), Archive: s.GetArchive()}, nil
}

func (m *memSessions) all() []*taskrunnerv1.SaveSessionRequest {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]*taskrunnerv1.SaveSessionRequest(nil), m.saved...)
}

// review is the follow-up the control plane hands over: a "changes requested" review's
// comment, with its file and line.
const review = "Review by ada (changes requested):\n- greet, line 15: please also accept -f as a short form of --farewell, and cover it in test.sh."

const revision = "add-farewell-short-flag"

// followUp runs the task's second run in a new sandbox, like the control plane would start it.
func (h *harness) followUp(s setup, sessions stages.SessionStore, prURL string) (stages.Outcome, *fakeReporter) {
	h.t.Helper()
	rep := newFakeReporter()
	opts := h.sandbox(s, true)
	opts.Reporter, opts.Sessions = rep, sessions
	opts.Task.Run, opts.Task.Followup, opts.Task.PRNumber, opts.Task.PRURL = 2, review, 1, prURL
	opts.Task.ConsoleURL, opts.Task.TraceURLTemplate = "https://console.example", "https://jaeger.example/trace/{trace_id}"
	out := stages.Run(context.Background(), opts)
	h.t.Logf("follow-up: %s %q %s", out.Status, out.Reason, out.PRURL)
	return out, rep
}

// prComments lists the PR's conversation comments through the forge's REST API.
func (h *harness) prComments() []*github.IssueComment {
	h.t.Helper()
	tok, err := h.minted.Token(context.Background())
	require.NoError(h.t, err)
	c := github.NewClient(h.forgeTS.Client()).WithAuthToken(tok.Value)
	c.BaseURL, err = url.Parse(h.forgeTS.URL + "/")
	require.NoError(h.t, err)
	cs, _, err := c.Issues.ListComments(context.Background(), owner, repoName, 1, nil)
	require.NoError(h.t, err)
	return cs
}

// withModel points later sandboxes at a new scripted model API answering from script.
func (h *harness) withModel(script *modelapi.Script) *modelapi.Server {
	m := modelapi.New(script, slog.New(slog.NewTextHandler(slogTestWriter{h.t}, &slog.HandlerOptions{Level: slog.LevelWarn})))
	ts := httptest.NewServer(m)
	h.t.Cleanup(ts.Close)
	h.model, h.modelURL = m, ts.URL
	return m
}

func TestFollowUp(t *testing.T) {
	t.Parallel()
	for _, agentName := range []string{agentClaude, agentCodex} {
		t.Run(agentName, func(t *testing.T) {
			t.Parallel()
			testFollowUp(t, agentName)
		})
	}
}

func testFollowUp(t *testing.T, agentName string) {
	s := setup{agent: agentName, script: demo[agentName].script, repo: owner + "/" + repoName, maxTurns: 20}
	h := newHarness(t, s)
	store := &memSessions{}
	h.opts.Sessions = store
	out := h.run(context.Background())
	require.Equal(t, stages.StatusCompleted, out.Status, out.Reason)
	branch := "taskrunner/" + h.taskID
	run1Head := strings.TrimSpace(h.git("rev-parse", branch))
	run1Usage := last(h.rep.Events(), (*taskrunnerv1.Event).GetUsage, func(e *taskrunnerv1.Event) bool { return e.GetUsage() != nil })

	// The first run saved its conversation, redacted.
	saved := store.all()
	require.Len(t, saved, 1)
	require.Equal(t, agentName, saved[0].GetAgent())
	require.EqualValues(t, 1, saved[0].GetRun())
	require.NotEmpty(t, saved[0].GetSessionId())
	m, files, err := session.Unpack(saved[0].GetArchive())
	require.NoError(t, err)
	require.Equal(t, saved[0].GetSessionId(), m.Session.ID)
	require.NotEmpty(t, files)
	for _, f := range files {
		require.NotContains(t, string(f.Data), "sk-ant-test-key")
		require.NotContains(t, string(f.Data), openAIKey)
	}
	require.Contains(t, string(files[0].Data), "Archived `add-farewell`;", "the transcript holds the first run's last answer")

	// The second run, in a new sandbox (another checkout path), revises the same PR.
	out2, rep := h.followUp(s, store, out.PRURL)
	require.Equal(t, stages.StatusCompleted, out2.Status, out2.Reason)
	require.Equal(t, out.PRURL, out2.PRURL)
	require.EqualValues(t, 1, out2.PRNumber)
	require.Len(t, h.forge.PullRequests(owner+"/"+repoName), 1, "no new PR")

	// (a) It cloned the PR's branch.
	require.True(t, rep.logged("cloning acme/greet (branch "+branch+")"))
	// (b) It resumed the conversation, and the model API saw the first run in its first request.
	require.True(t, rep.logged("resuming the "+agentName+" conversation of run 1"))
	var checked []modelapi.HistoryCheck
	for _, r := range h.model.Requests() {
		if r.Stage == "followup-propose" && r.Turn == 0 {
			checked = append(checked, r.History)
		}
	}
	require.Equal(t, []modelapi.HistoryCheck{modelapi.HistoryFound}, checked)

	// (c) One new commit on top of the first run's, implementing the review.
	require.Equal(t, run1Head, strings.TrimSpace(h.git("rev-parse", branch+"^")), "a plain fast-forward: nothing rewritten")
	require.Contains(t, h.git("log", "-1", "--format=%B", branch), "Run: 2")
	require.Contains(t, h.git("show", branch+":greet"), "-f | --farewell)")
	require.Contains(t, h.git("show", branch+":test.sh"), `check "Goodbye, Ada!" -f Ada`)
	tree := h.git("ls-tree", "-r", "--name-only", branch)
	require.Regexp(t, `openspec/changes/archive/\d{4}-\d{2}-\d{2}-`+revision+`/proposal\.md`, tree)
	require.Regexp(t, `openspec/changes/archive/\d{4}-\d{2}-\d{2}-add-farewell/proposal\.md`, tree)
	require.Contains(t, h.git("show", branch+":openspec/specs/greet/spec.md"), "Short farewell flag")

	// (d) A comment on the PR says what changed: this run's files and line counts.
	cs := h.prComments()
	require.Len(t, cs, 1)
	body := cs[0].GetBody()
	short := strings.TrimSpace(h.git("rev-parse", "--short", branch))
	for _, want := range []string{"**taskrunner run 2** pushed a revision.", "> - greet, line 15: please also accept -f",
		"Commits: `" + short + "`", "| `greet` | 1 | 1 |", "| `test.sh` | 1 | 0 |", "**Run 2** · change `" + revision + "`",
		"| archive |", "[Task in the console](https://console.example/tasks/" + h.taskID + ")",
		"[Trace `" + traceID + "`](https://jaeger.example/trace/" + traceID + ")"} {
		require.Contains(t, body, want)
	}
	prBody := h.forge.PullRequests(owner + "/" + repoName)[0].Body
	require.Contains(t, prBody, "**Run 1** · change `add-farewell`")
	require.Contains(t, prBody, "**Run 2** · change `"+revision+"`")

	// (e) No tooling scaffolding in the PR, from either run.
	prFiles := h.git("diff", "--name-only", "main..."+branch)
	require.NotRegexp(t, `(?m)^\.(claude|codex|agents)/`, prFiles)
	require.NotContains(t, prFiles, "openspec/config.yaml")

	// The events of the run: the revision's stages, this run's diff and usage, the same PR.
	evs := rep.Events()
	require.Equal(t, []string{
		"stage:propose", "usage", "stage:apply", "usage", "diff_stats",
		"stage:archive", "diff_stats", "usage", "completed",
	}, kinds(evs))
	var changes []string
	for _, ev := range evs {
		if sc := ev.GetStageChange(); sc != nil {
			changes = append(changes, sc.GetChange())
		}
	}
	require.Equal(t, []string{"", revision, revision}, changes)
	want := workspace.ParseNumstat(h.git("diff", "--numstat", run1Head, branch))
	ds := last(evs, (*taskrunnerv1.Event).GetDiffStats, func(e *taskrunnerv1.Event) bool { return e.GetDiffStats() != nil })
	require.Equal(t, want.FilesChanged, ds.GetFilesChanged(), "a follow-up reports its own diff")
	require.Equal(t, want.Additions, ds.GetAdditions())
	require.Equal(t, want.Deletions, ds.GetDeletions())
	u := last(evs, (*taskrunnerv1.Event).GetUsage, func(e *taskrunnerv1.Event) bool { return e.GetUsage() != nil })
	in, outTok := scriptedTokens(t, s.script, "followup-propose", "followup-apply", "archive")
	require.Equal(t, in, u.GetTokensIn(), "the run's own tokens, not the conversation's")
	require.Equal(t, outTok, u.GetTokensOut())
	require.Positive(t, u.GetCostUsd())
	require.Less(t, u.GetCostUsd(), run1Usage.GetCostUsd(), "the run's own cost, not the conversation's")
	c := evs[len(evs)-1].GetCompleted()
	require.Equal(t, out.PRURL, c.GetPrUrl())
	require.EqualValues(t, 1, c.GetPrNumber())

	// The follow-up saved the longer conversation for a third run.
	saved = store.all()
	require.Len(t, saved, 2)
	require.EqualValues(t, 2, saved[1].GetRun())
	require.Equal(t, saved[0].GetSessionId(), saved[1].GetSessionId(), "the same conversation, resumed")
	all := eventsJSON(t, evs)
	for _, tok := range h.minted.minted {
		require.NotContains(t, all, tok)
		require.NotContains(t, body, tok)
	}
}

// scriptedTokens sums the tokens a script's stages report over all their turns (one request
// per turn).
func scriptedTokens(t *testing.T, path string, stageNames ...string) (in, out int64) {
	script, err := modelapi.LoadScript(path)
	require.NoError(t, err)
	for _, name := range stageNames {
		found := false
		for _, st := range script.Stages {
			if st.Name == name {
				found = true
				require.NotNil(t, st.Usage, name)
				in += int64(st.Usage.InputTokens * len(st.Turns))
				out += int64(st.Usage.OutputTokens * len(st.Turns))
			}
		}
		require.True(t, found, name)
	}
	return in, out
}

// Without a saved session the follow-up still works from the branch alone, and the scripted
// model API's history assertion catches a follow-up that did not resume.
func TestFollowUpWithoutSession(t *testing.T) {
	t.Parallel()
	s := setup{agent: agentClaude, script: demo[agentClaude].script, repo: owner + "/" + repoName, maxTurns: 20}
	h := newHarness(t, s)
	out := h.run(context.Background())
	require.Equal(t, stages.StatusCompleted, out.Status, out.Reason)
	branch := "taskrunner/" + h.taskID
	run1Head := strings.TrimSpace(h.git("rev-parse", branch))
	empty := &memSessions{}

	// The demo script asserts the resume: a cold follow-up fails, and nothing is pushed.
	out2, rep := h.followUp(s, empty, out.PRURL)
	require.Equal(t, stages.StatusFailed, out2.Status)
	require.Contains(t, out2.Reason, "propose stage: claude:")
	require.Contains(t, out2.Reason, "the session was not resumed")
	require.True(t, rep.logged("the follow-up starts from the branch alone: no session was saved"))
	require.Equal(t, run1Head, strings.TrimSpace(h.git("rev-parse", branch)))
	require.Empty(t, h.prComments())
	failed := empty.all()
	require.Len(t, failed, 1, "a failed run saves its session too")
	require.EqualValues(t, 2, failed[0].GetRun())

	// The same answers without the assertion: the follow-up works from the branch alone.
	script, err := modelapi.LoadScript(s.script)
	require.NoError(t, err)
	h.withModel(script.WithoutHistory())
	out3, rep := h.followUp(s, &memSessions{}, out.PRURL)
	require.Equal(t, stages.StatusCompleted, out3.Status, out3.Reason)
	require.True(t, rep.logged("the follow-up starts from the branch alone: no session was saved"))
	require.Equal(t, run1Head, strings.TrimSpace(h.git("rev-parse", branch+"^")))
	require.Contains(t, h.git("show", branch+":greet"), "-f | --farewell)")
	require.Len(t, h.prComments(), 1)
	var prompts []string
	for _, r := range h.model.Requests() {
		if r.Stage == "followup-propose" && r.Turn == 0 {
			prompts = append(prompts, r.Prompt)
			require.Equal(t, modelapi.HistoryNotChecked, r.History)
		}
	}
	require.Len(t, prompts, 1, "a cold start, answered without the assertion")
}
