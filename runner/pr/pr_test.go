package pr

import (
	"os"
	"path/filepath"
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
	b := Body("t1", "Summary.", []StageCost{{"explore", 0.25}, {"propose", 0.5}}, "abc123", "")
	require.Contains(t, b, "Summary.")
	require.Contains(t, b, "| explore | 0.2500 |")
	require.Contains(t, b, "| total | 0.7500 |")
	require.Contains(t, b, "Trace id: `abc123`")
	require.NotContains(t, b, "Incomplete")
	require.Contains(t, Body("t1", "", nil, "", "timeout"), "**Incomplete**: the task stopped before finishing (timeout)")
}
