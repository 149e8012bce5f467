package pr

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestProposal(t *testing.T) {
	cases := []struct {
		name, proposal, title, summary string
	}{
		{"generic heading", "# Proposal\n\n## Why\n\nBecause.\n", "add-x", "## Why\n\nBecause."},
		{"real heading", "# Add a farewell flag\n\nText.", "Add a farewell flag", "Text."},
		{"prefixed heading", "## Proposal: Faster greet\nBody", "Faster greet", "Body"},
		{"no proposal", "", "add-x", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if tc.proposal != "" {
				require.NoError(t, os.WriteFile(filepath.Join(dir, "proposal.md"), []byte(tc.proposal), 0o644))
			}
			title, summary := Change{Name: "add-x", Dir: dir}.Proposal()
			require.Equal(t, tc.title, title)
			require.Equal(t, tc.summary, summary)
		})
	}
}

func TestBody(t *testing.T) {
	links := Links{ConsoleURL: ConsoleLink("https://console.example/", "t1"), TraceID: "abc123",
		TraceURL: TraceLink("https://jaeger.example/trace/{trace_id}", "abc123")}
	b := Body("t1", "Summary.", Run{Number: 1, Change: "add-x", Costs: []StageCost{{"explore", 0.25}, {"propose", 0.5}}}, links)
	require.Contains(t, b, "Summary.")
	require.Contains(t, b, "**Run 1** · change `add-x`")
	require.Contains(t, b, "| explore | 0.2500 |")
	require.Contains(t, b, "| total | 0.7500 |")
	require.Contains(t, b, "[Task in the console](https://console.example/tasks/t1)")
	require.Contains(t, b, "[Trace `abc123`](https://jaeger.example/trace/abc123)")
	require.NotContains(t, b, "Incomplete")
	require.Contains(t, Body("t1", "", Run{Number: 1}, Links{TraceID: "abc"}), "Trace id: `abc`")
	require.Contains(t, Body("t1", "", Run{Number: 1, Incomplete: "timeout"}, Links{}), "**Incomplete**: the task stopped before finishing (timeout)")

	// A follow-up's run goes at the end of the runs section, before the links.
	b2 := AddRun(b, Run{Number: 2, Change: "add-y", Costs: []StageCost{{"apply", 0.1}}})
	require.Less(t, strings.Index(b2, "**Run 1**"), strings.Index(b2, "**Run 2** · change `add-y`"))
	require.Less(t, strings.Index(b2, "| apply | 0.1000 |"), strings.Index(b2, "[Task in the console]"))
	require.Contains(t, AddRun("hand-written", Run{Number: 3}), "hand-written\n\n**Run 3**")
}

func TestRevision(t *testing.T) {
	m := Revision{
		Run:      Run{Number: 2, Change: "add-y", Costs: []StageCost{{"propose", 0.1}, {"apply", 0.2}}},
		Followup: "greet:12: also accept -f\nplease",
		Summary:  "Adds -f.",
		Commits:  []string{"abc1234"},
		Files:    []FileStat{{Path: "greet", Additions: 1, Deletions: 1}, {Path: "logo.png", Binary: true}},
		Links:    Links{TraceID: "abc"},
	}.Markdown()
	for _, want := range []string{"**taskrunner run 2** pushed a revision.", "> greet:12: also accept -f\n> please", "Adds -f.",
		"Commits: `abc1234`", "| `greet` | 1 | 1 |", "| `logo.png` | binary | |", "| **2 files** | **1** | **1** |",
		"| total | 0.3000 |", "Trace id: `abc`"} {
		require.Contains(t, m, want)
	}
}
