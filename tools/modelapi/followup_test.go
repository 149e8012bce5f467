package modelapi

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"
)

const followupPrompt = "Follow-up on pull request #1 (run 2 of this task): revise the work on this branch.\n\n" +
	"The original request was:\nAdd a --farewell flag to greet\n\n…\ngreet, line 15: please also accept -f"

// The demo scripts pick the follow-up's stages for the follow-up's prompts, and the first
// run's stages for everything else, for both agents.
func TestDemoScriptsSelectTheFollowUpStages(t *testing.T) {
	for _, tc := range []struct {
		script, propose, apply, archive string
	}{
		{"../demo/claude-demo.yaml", "/opsx:propose ", "/opsx:apply ", "/opsx:archive "},
		{"../demo/codex-demo.yaml", "$openspec-propose ", "$openspec-apply-change ", "$openspec-archive-change "},
	} {
		t.Run(tc.script, func(t *testing.T) {
			s, err := LoadScript(tc.script)
			require.NoError(t, err)
			for _, c := range []struct{ prompt, stage, change, revision string }{
				{tc.propose + followupPrompt, "followup-propose", "add-farewell", "add-farewell-short-flag"},
				{tc.propose + "Add a --farewell flag to greet", "propose", "add-farewell", "add-farewell-short-flag"},
				{tc.apply + "add-farewell-short-flag", "followup-apply", "add-farewell", "add-farewell-short-flag"},
				{tc.apply + "add-farewell", "apply", "add-farewell", "add-farewell-short-flag"},
				{tc.archive + "add-farewell-short-flag", "archive", "add-farewell-short-flag", "add-farewell-short-flag"},
			} {
				st, vars := s.match(Prompt{Text: c.prompt, Workspace: "/w"})
				require.NotNil(t, st, c.prompt)
				require.Equal(t, c.stage, st.Name, c.prompt)
				require.Equal(t, c.change, vars["change"])
				require.Equal(t, c.revision, vars["revision"])
				for i, turn := range st.Turns {
					if tc.propose[0] == '/' {
						_, err = turn.render(vars)
					} else {
						_, err = responsesOutput(turn, vars, 1, i)
					}
					require.NoError(t, err, "stage %s turn %d renders", st.Name, i)
				}
			}
			st, _ := s.match(Prompt{Text: tc.propose + followupPrompt})
			require.Equal(t, "Archived `add-farewell`;", st.History, "the follow-up asserts the resume")
			require.Empty(t, s.WithoutHistory().Stages[0].History)
			require.NotEmpty(t, s.Stages[0].History, "WithoutHistory copies the script")
		})
	}
}

const historyScript = `
stages:
  - name: followup
    match: '^Follow-up'
    history: 'Archived .add-farewell.;'
    turns:
      - - text: "Revising."
        - tool_use: {name: Bash, input: {command: "true"}}
      - - text: "Done."
`

func newHistoryServer(t *testing.T, script *Script) (*Server, string) {
	srv := New(script, slog.New(slog.NewTextHandler(io.Discard, nil)))
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	return srv, hs.URL
}

// The first request of a stage with `history` must carry the earlier conversation; a request
// without it is answered with a non-retryable 400 that names the missing resume.
func TestHistoryAssertion(t *testing.T) {
	script, err := ParseScript([]byte(historyScript))
	require.NoError(t, err)
	earlier := []map[string]any{
		userBlocks(text("/opsx:archive add-farewell")),
		assistant(text("Archived `add-farewell`; its requirements are now in openspec/specs/greet/spec.md.")),
	}
	prompt := userBlocks(text(followupPrompt))
	toolRound := []map[string]any{
		assistant(text("Revising."), map[string]any{"type": "tool_use", "id": "t1", "name": "Bash", "input": map[string]any{}}),
		userBlocks(toolResult("t1", "")),
	}
	messages := func(msgs ...[]map[string]any) map[string]any {
		var all []map[string]any
		for _, m := range msgs {
			all = append(all, m...)
		}
		return map[string]any{"model": "m", "messages": all}
	}

	t.Run("messages API", func(t *testing.T) {
		srv, url := newHistoryServer(t, script)
		resp, body := post(t, url+"/v1/messages", messages(earlier, []map[string]any{prompt}))
		require.Equal(t, http.StatusOK, resp.StatusCode, string(body))

		resp, body = post(t, url+"/v1/messages", messages([]map[string]any{prompt}))
		require.Equal(t, http.StatusBadRequest, resp.StatusCode)
		require.Equal(t, "false", resp.Header.Get("x-should-retry"))
		var e struct {
			Error struct{ Type, Message string }
		}
		require.NoError(t, json.Unmarshal(body, &e))
		require.Equal(t, "invalid_request_error", e.Error.Type)
		require.Contains(t, e.Error.Message, `stage "followup" must continue the earlier conversation`)
		require.Contains(t, e.Error.Message, "the session was not resumed")

		// A later turn of the stage is not checked (the CLI resends what the first had).
		resp, body = post(t, url+"/v1/messages", messages([]map[string]any{prompt}, toolRound))
		require.Equal(t, http.StatusOK, resp.StatusCode, string(body))

		var got []HistoryCheck
		for _, r := range srv.Requests() {
			got = append(got, r.History)
		}
		require.Equal(t, []HistoryCheck{HistoryFound, HistoryMissing, HistoryNotChecked}, got)

		// Without the assertion the cold request is answered.
		_, url = newHistoryServer(t, script.WithoutHistory())
		resp, body = post(t, url+"/v1/messages", messages([]map[string]any{prompt}))
		require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
	})

	t.Run("responses API", func(t *testing.T) {
		srv, url := newHistoryServer(t, script)
		earlierItems := []map[string]any{
			userItem("$openspec-archive-change add-farewell"),
			{"type": "message", "role": "assistant", "content": []any{map[string]any{"type": "output_text", "text": "Archived `add-farewell`; done."}}},
		}
		resp, body := post(t, url+"/v1/responses", map[string]any{"model": "m", "input": append(earlierItems, userItem(followupPrompt))})
		require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
		resp, body = post(t, url+"/v1/responses", map[string]any{"model": "m", "input": []map[string]any{userItem(followupPrompt)}})
		require.Equal(t, http.StatusBadRequest, resp.StatusCode)
		require.Contains(t, string(body), "the session was not resumed")
		var got []HistoryCheck
		for _, r := range srv.Requests() {
			got = append(got, r.History)
		}
		require.Equal(t, []HistoryCheck{HistoryFound, HistoryMissing}, got)
	})
}
