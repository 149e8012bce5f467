package task

import (
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/taskrunner/taskrunner/services/errs"
)

func TestApplyLegalStatusMoves(t *testing.T) {
	legal := []struct{ from, to Status }{
		{StatusProposing, StatusQueued}, {StatusProposing, StatusRunning}, {StatusProposing, StatusCancelled}, {StatusProposing, StatusFailed},
		{StatusQueued, StatusRunning}, {StatusQueued, StatusCancelled}, {StatusQueued, StatusFailed},
		{StatusRunning, StatusAwaitingReview}, {StatusRunning, StatusFailed}, {StatusRunning, StatusCancelled},
		{StatusAwaitingReview, StatusDone}, {StatusAwaitingReview, StatusCancelled}, {StatusAwaitingReview, StatusFailed},
	}
	for _, tc := range legal {
		t.Run(string(tc.from)+"->"+string(tc.to), func(t *testing.T) {
			cur := Task{ID: "t", Status: tc.from}
			if tc.from == StatusAwaitingReview {
				cur.PRURL = "http://forge/pr/1"
			}
			a := Advance{Status: tc.to}
			if tc.to == StatusAwaitingReview {
				a.PRURL = "http://forge/pr/1"
			}
			out, err := Apply(cur, a, true)
			require.NoError(t, err)
			require.Equal(t, tc.to, out.Status)
		})
	}
}

func TestApplyIllegal(t *testing.T) {
	running := Task{ID: "t", Status: StatusRunning, Stage: StageApply}
	cases := []struct {
		name       string
		cur        Task
		a          Advance
		hasSandbox bool
		kind       error
		msg        string
	}{
		{"stage backward", running, Advance{Stage: StagePropose}, true, errs.ErrInvalidTransition, "only move forward"},
		{"same stage", running, Advance{Stage: StageApply}, true, errs.ErrInvalidTransition, "only move forward"},
		{"running without dispatch", Task{ID: "t", Status: StatusProposing}, Advance{Status: StatusRunning}, false, errs.ErrInvalidTransition, "never dispatched"},
		{"stage while proposing", Task{ID: "t", Status: StatusProposing}, Advance{Stage: StageExplore}, false, errs.ErrInvalidTransition, "only while running"},
		{"diff while awaiting review", Task{ID: "t", Status: StatusAwaitingReview, PRURL: "u"}, Advance{Diff: &DiffStats{1, 1, 1}}, true, errs.ErrInvalidTransition, "only while running"},
		{"done from running", running, Advance{Status: StatusDone}, true, errs.ErrInvalidTransition, "cannot move from running to done"},
		{"review without PR", running, Advance{Status: StatusAwaitingReview}, true, errs.ErrInvalidTransition, "without a pull request"},
		{"back to proposing", running, Advance{Status: StatusProposing}, true, errs.ErrInvalidTransition, "cannot move"},
		{"reason while running", running, Advance{FailedReason: "x"}, true, errs.ErrInvalidArgument, "failed_reason"},
		{"nothing", running, Advance{}, true, errs.ErrInvalidArgument, "nothing to change"},
		{"negative diff", running, Advance{Diff: &DiffStats{-1, 0, 0}}, true, errs.ErrInvalidArgument, "diff_stats"},
	}
	for _, terminal := range []Status{StatusDone, StatusFailed, StatusCancelled} {
		for _, a := range []Advance{{Status: StatusRunning}, {Stage: StageArchive}, {Heartbeat: true}, {Status: StatusCancelled}, {Status: StatusFailed, FailedReason: "x"}} {
			cases = append(cases, struct {
				name       string
				cur        Task
				a          Advance
				hasSandbox bool
				kind       error
				msg        string
			}{"after " + string(terminal), Task{ID: "t", Status: terminal}, a, true, errs.ErrInvalidTransition, "no further changes"})
		}
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out, err := Apply(tc.cur, tc.a, tc.hasSandbox)
			require.Error(t, err)
			require.True(t, errors.Is(err, tc.kind), "got %v", err)
			require.Contains(t, err.Error(), tc.msg)
			require.Equal(t, tc.cur, out, "a rejected transition returns the task unchanged")
		})
	}
}

func TestApplyRunnerReports(t *testing.T) {
	cur := Task{ID: "t", Status: StatusRunning}
	for _, st := range Stages {
		out, err := Apply(cur, Advance{Stage: st}, true)
		require.NoError(t, err)
		require.Equal(t, st, out.Stage)
		cur = out
	}
	out, err := Apply(cur, Advance{Diff: &DiffStats{3, 1, 2}, Usage: &Usage{CostUSD: 0.5, TokensIn: 10, TokensOut: 20}, Heartbeat: true}, true)
	require.NoError(t, err)
	require.Equal(t, DiffStats{3, 1, 2}, out.Diff)
	require.Equal(t, 0.5, out.Usage.CostUSD)
	out, err = Apply(out, Advance{Status: StatusAwaitingReview, PRURL: "http://f/pr/7", PRNumber: 7}, true)
	require.NoError(t, err)
	require.Equal(t, StatusAwaitingReview, out.Status)
	require.Equal(t, int64(7), out.PRNumber)
}

func TestCleanReason(t *testing.T) {
	long := strings.Repeat("é", 2000)
	require.LessOrEqual(t, len(CleanReason(long)), MaxReasonBytes)
	require.True(t, strings.HasPrefix(CleanReason(long), "é"))
	got := CleanReason("clone failed: https://x-access-token:ghs_abcdefghijklmnopqrstuvwxyz0123@forge/o/r.git with Bearer abcdefghijklmnop1234")
	require.NotContains(t, got, "ghs_abcdefghijklmnopqrstuvwxyz0123")
	require.NotContains(t, got, "abcdefghijklmnop1234")
	require.Contains(t, got, "[REDACTED]")
}

func TestValidate(t *testing.T) {
	cases := []struct {
		name  string
		n     NewTask
		field string
	}{
		{"empty prompt", NewTask{Repo: "o/r", Prompt: "  "}, "prompt"},
		{"huge prompt", NewTask{Repo: "o/r", Prompt: strings.Repeat("a", MaxPromptBytes+1)}, "prompt"},
		{"no repo", NewTask{Prompt: "p"}, "repo"},
		{"repo without slash", NewTask{Repo: "repo", Prompt: "p"}, "repo"},
		{"repo with two slashes", NewTask{Repo: "a/b/c", Prompt: "p"}, "repo"},
		{"bad owner", NewTask{Repo: "-a/b", Prompt: "p"}, "repo"},
		{"branch with space", NewTask{Repo: "o/r", BaseBranch: "my branch", Prompt: "p"}, "base_branch"},
		{"branch with ..", NewTask{Repo: "o/r", BaseBranch: "a..b", Prompt: "p"}, "base_branch"},
		{"branch .lock", NewTask{Repo: "o/r", BaseBranch: "x.lock", Prompt: "p"}, "base_branch"},
		{"unknown agent", NewTask{Repo: "o/r", Prompt: "p", Agent: "gpt"}, "agent"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.n.Validate()
			var de *errs.Error
			require.ErrorAs(t, err, &de)
			require.Equal(t, tc.field, de.Field)
			require.True(t, strings.HasPrefix(de.Message, tc.field+":"), de.Message)
		})
	}
	ok := NewTask{Repo: "octo-org/my.repo_1", Prompt: "do it", BaseBranch: "release/1.2"}
	require.NoError(t, ok.Validate())
	require.Equal(t, AgentClaude, ok.Agent)
	def := NewTask{Repo: "o/r", Prompt: "p"}
	require.NoError(t, def.Validate())
	require.Equal(t, "main", def.BaseBranch)
}

func TestRecordPROnlyOnAFailedTaskWithoutOne(t *testing.T) {
	const url = "https://github.com/acme/widgets/pull/3"
	for _, tc := range []struct {
		name string
		task Task
		ok   bool
	}{
		{"failed without a pull request", Task{ID: "t", Status: StatusFailed, FailedReason: "timeout", LastSeq: 4}, true},
		{"failed with one", Task{ID: "t", Status: StatusFailed, PRURL: "https://x/pull/1"}, false},
		{"cancelled", Task{ID: "t", Status: StatusCancelled}, false},
		{"done", Task{ID: "t", Status: StatusDone, PRURL: url}, false},
		{"running", Task{ID: "t", Status: StatusRunning}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.ok, AcceptsLateRunner(tc.task))
			n, err := RecordPR(tc.task, url, 3, 7)
			if !tc.ok {
				require.ErrorIs(t, err, errs.ErrInvalidTransition)
				require.Equal(t, tc.task, n)
				return
			}
			require.NoError(t, err)
			require.Equal(t, url, n.PRURL)
			require.EqualValues(t, 3, n.PRNumber)
			require.EqualValues(t, 7, n.LastSeq)
			require.Equal(t, StatusFailed, n.Status)
			require.Equal(t, "timeout", n.FailedReason, "only the pull request changes")
			require.False(t, AcceptsLateRunner(n))
		})
	}
	_, err := RecordPR(Task{Status: StatusFailed}, "", 0, 1)
	require.ErrorIs(t, err, errs.ErrInvalidArgument)
}
