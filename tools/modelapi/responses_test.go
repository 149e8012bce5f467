package modelapi

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"
)

const responsesScript = `
vars: {change: demo}
stages:
  - name: propose
    match: '^\$openspec-propose (?P<change>\S+)'
    usage: {input_tokens: 11, cached_input_tokens: 5, output_tokens: 22}
    turns:
      - - text: "Writing {{.change}}."
        - tool_use: {name: exec_command, input: {cmd: "cat > {{.workspace}}/{{.change}}.md <<'EOF'\nx\nEOF"}}
        - custom: {name: apply_patch, input: "*** Begin Patch\n*** Add File: {{.change}}.txt\n+hi\n*** End Patch\n"}
      - - text: "Done."
  - name: failing
    match: '^\$fail-in-stream'
    turns:
      - error: {in_stream: true, type: server_error, message: "stream boom"}
  - name: http
    match: '^\$fail-http'
    turns:
      - error: {status: 400, message: "bad boom", no_retry: true}
`

func newResponsesServer(t *testing.T) (*Server, *httptest.Server) {
	t.Helper()
	s, err := ParseScript([]byte(responsesScript))
	require.NoError(t, err)
	srv := New(s, slog.New(slog.NewTextHandler(io.Discard, nil)))
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	return srv, hs
}

func userItem(text string) map[string]any {
	return map[string]any{"type": "message", "role": "user", "content": []any{map[string]any{"type": "input_text", "text": text}}}
}

// codexInput is the input of Codex's first request of a turn: developer instructions, the
// environment context, the prompt and the expanded skill.
func codexInput(prompt string, extra ...map[string]any) []map[string]any {
	in := []map[string]any{
		{"type": "message", "role": "developer", "content": []any{map[string]any{"type": "input_text", "text": "You are a coding agent."}}},
		userItem("<environment_context>\n  <cwd>/tmp/w s</cwd>\n  <shell>bash</shell>\n</environment_context>"),
		userItem(prompt),
		userItem("<skill>\n<name>openspec-propose</name>\n…</skill>"),
	}
	return append(in, extra...)
}

func TestReadResponsesPrompt(t *testing.T) {
	fc := func(id, call string) map[string]any {
		return map[string]any{"type": "function_call", "id": id, "call_id": call, "name": "exec_command", "arguments": "{}"}
	}
	out := func(call string) map[string]any {
		return map[string]any{"type": "function_call_output", "call_id": call, "output": "ok " + call}
	}
	asst := func(id, text string) map[string]any {
		return map[string]any{"type": "message", "id": id, "role": "assistant", "content": []any{map[string]any{"type": "output_text", "text": text}}}
	}
	cases := []struct {
		name     string
		input    []map[string]any
		text     string
		turn     int
		lastUser string
	}{
		{name: "first request", input: codexInput("$openspec-propose x"), text: "$openspec-propose x", turn: 0, lastUser: "$openspec-propose x"},
		{
			name: "turn read from the ids, parallel calls interleaved with their outputs",
			input: codexInput("$openspec-propose x",
				asst("msg_modelapi_4_t0_0", "Writing."), fc("fc_modelapi_4_t0_1", "call_modelapi_4_t0_1"), out("call_modelapi_4_t0_1"),
				fc("fc_modelapi_4_t0_2", "call_modelapi_4_t0_2"), out("call_modelapi_4_t0_2"),
				fc("fc_modelapi_5_t1_0", "call_modelapi_5_t1_0"), out("call_modelapi_5_t1_0")),
			text: "$openspec-propose x", turn: 2, lastUser: "ok call_modelapi_5_t1_0",
		},
		{
			name:  "foreign ids: runs of assistant items are turns",
			input: codexInput("$openspec-propose x", fc("a", "b"), fc("c", "d"), out("b"), out("d"), asst("m", "more"), fc("e", "f"), out("f")),
			text:  "$openspec-propose x", turn: 2, lastUser: "ok f",
		},
		{
			name: "a resumed thread: the newest prompt counts",
			input: append(codexInput("$openspec-explore x", asst("msg_modelapi_9_t3_0", "Explored.")),
				userItem("<environment_context>\n  <cwd>/tmp/w s</cwd>\n</environment_context>"), userItem("$openspec-propose y")),
			text: "$openspec-propose y", turn: 0, lastUser: "$openspec-propose y",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			raw, err := json.Marshal(tc.input)
			require.NoError(t, err)
			p := readResponsesPrompt(items(raw))
			require.Equal(t, tc.text, p.Text)
			require.Equal(t, tc.turn, p.Turn)
			require.Equal(t, "/tmp/w s", p.Workspace)
			require.Equal(t, tc.lastUser, p.LastUserText)
		})
	}
	p := readResponsesPrompt(items(json.RawMessage(`"just a string"`)))
	require.Equal(t, "just a string", p.Text)
}

func responsesRequestBody(stream bool, prompt string, extra ...map[string]any) map[string]any {
	return map[string]any{"model": "gpt-test", "stream": stream, "input": codexInput(prompt, extra...)}
}

func TestResponsesStreamsScriptedTurns(t *testing.T) {
	srv, hs := newResponsesServer(t)

	resp, body := post(t, hs.URL+"/v1/responses", responsesRequestBody(true, "$openspec-propose add-x"))
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
	evs := parseSSE(t, bytes.NewReader(body))
	require.Equal(t, []string{
		"response.created",
		"response.output_item.added", "response.output_item.done",
		"response.output_item.added", "response.output_item.done",
		"response.output_item.added", "response.output_item.done",
		"response.completed",
	}, names(evs))
	var done []map[string]any
	for i, e := range evs {
		require.EqualValues(t, i, e.Data["sequence_number"])
		if e.Name == "response.output_item.done" {
			done = append(done, e.Data["item"].(map[string]any))
		}
	}
	require.Equal(t, "message", done[0]["type"])
	require.Equal(t, "assistant", done[0]["role"])
	require.Equal(t, []any{map[string]any{"type": "output_text", "text": "Writing add-x.", "annotations": []any{}}}, done[0]["content"])
	require.Equal(t, "function_call", done[1]["type"])
	require.Equal(t, "exec_command", done[1]["name"])
	var args map[string]any
	require.NoError(t, json.Unmarshal([]byte(done[1]["arguments"].(string)), &args))
	require.Equal(t, map[string]any{"cmd": "cat > /tmp/w s/add-x.md <<'EOF'\nx\nEOF"}, args, "named group overrides vars; workspace from <cwd>")
	require.Regexp(t, `^call_modelapi_\d+_t0_1$`, done[1]["call_id"])
	require.Equal(t, "custom_tool_call", done[2]["type"])
	require.Equal(t, "apply_patch", done[2]["name"])
	require.Equal(t, "*** Begin Patch\n*** Add File: add-x.txt\n+hi\n*** End Patch\n", done[2]["input"])
	completed := evs[len(evs)-1].Data["response"].(map[string]any)
	require.Equal(t, "completed", completed["status"])
	require.Equal(t, "gpt-test", completed["model"])
	require.Equal(t, map[string]any{
		"input_tokens": float64(11), "input_tokens_details": map[string]any{"cached_tokens": float64(5)},
		"output_tokens": float64(22), "output_tokens_details": map[string]any{"reasoning_tokens": float64(0)},
		"total_tokens": float64(33),
	}, completed["usage"])

	// The CLI sends the items back with their outputs: the next turn, plain JSON this time.
	resp, body = post(t, hs.URL+"/v1/responses", responsesRequestBody(false, "$openspec-propose add-x",
		done[0], done[1], map[string]any{"type": "function_call_output", "call_id": done[1]["call_id"], "output": "ok"},
		done[2], map[string]any{"type": "custom_tool_call_output", "call_id": done[2]["call_id"], "output": "Success"}))
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var r map[string]any
	require.NoError(t, json.Unmarshal(body, &r))
	out := r["output"].([]any)
	require.Len(t, out, 1)
	require.Equal(t, "Done.", out[0].(map[string]any)["content"].([]any)[0].(map[string]any)["text"])

	reqs := srv.Requests()
	require.Len(t, reqs, 2)
	require.Equal(t, Request{Method: "POST", Path: "/v1/responses", Stage: "propose", Turn: 0, Status: 200, Stream: true, Prompt: "$openspec-propose add-x", InputTokens: 11, OutputTokens: 22}, reqs[0])
	require.Equal(t, Request{Method: "POST", Path: "/v1/responses", Stage: "propose", Turn: 1, Status: 200, Prompt: "$openspec-propose add-x", InputTokens: 11, OutputTokens: 22}, reqs[1])
}

func TestResponsesErrors(t *testing.T) {
	_, hs := newResponsesServer(t)
	errOf := func(body []byte) map[string]any {
		var m map[string]any
		require.NoError(t, json.Unmarshal(body, &m))
		return m["error"].(map[string]any)
	}

	resp, body := post(t, hs.URL+"/v1/responses", responsesRequestBody(true, "$fail-in-stream"))
	require.Equal(t, http.StatusOK, resp.StatusCode)
	evs := parseSSE(t, bytes.NewReader(body))
	require.Equal(t, []string{"response.created", "response.failed"}, names(evs))
	failed := evs[1].Data["response"].(map[string]any)
	require.Equal(t, "failed", failed["status"])
	require.Equal(t, map[string]any{"code": "server_error", "message": "stream boom"}, failed["error"])

	resp, body = post(t, hs.URL+"/v1/responses", responsesRequestBody(true, "$fail-http"))
	require.Equal(t, http.StatusBadRequest, resp.StatusCode)
	require.Equal(t, "false", resp.Header.Get("x-should-retry"))
	require.Equal(t, "bad boom", errOf(body)["message"])
	require.Equal(t, "invalid_request_error", errOf(body)["type"])

	resp, body = post(t, hs.URL+"/v1/responses", responsesRequestBody(true, "$unknown-skill"))
	require.Equal(t, http.StatusBadRequest, resp.StatusCode)
	require.Contains(t, errOf(body)["message"], "modelapi: no scripted answer for: $unknown-skill")

	resp, body = post(t, hs.URL+"/v1/responses", responsesRequestBody(true, "$openspec-propose x",
		map[string]any{"type": "function_call", "id": "fc_modelapi_1_t1_0", "call_id": "c", "name": "exec_command", "arguments": "{}"}))
	require.Equal(t, http.StatusBadRequest, resp.StatusCode)
	require.Contains(t, errOf(body)["message"], `stage "propose" has 2 turns, turn 2 requested`)

	resp, err := http.Post(hs.URL+"/v1/responses", "application/json", bytes.NewReader([]byte("{")))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusBadRequest, resp.StatusCode)
}

func TestCodexDemoScriptMatchesTheFourStages(t *testing.T) {
	s, err := LoadScript("../demo/codex-demo.yaml")
	require.NoError(t, err)
	for _, tc := range []struct {
		prompt, stage, change string
	}{
		{"$openspec-explore Add a --farewell flag to greet", "explore", "add-farewell"},
		{"$openspec-propose Add a --farewell flag to greet", "propose", "add-farewell"},
		{"$openspec-apply-change add-other", "apply", "add-other"},
		{"$openspec-archive-change add-farewell", "archive", "add-farewell"},
	} {
		st, vars := s.match(Prompt{Text: tc.prompt, Workspace: "/w"})
		require.NotNil(t, st, tc.prompt)
		require.Equal(t, tc.stage, st.Name)
		require.Equal(t, tc.change, vars["change"])
		for i, turn := range st.Turns {
			_, err := responsesOutput(turn, vars, 1, i)
			require.NoError(t, err, "stage %s turn %d renders", st.Name, i)
		}
	}
	st, _ := s.match(Prompt{Text: "/opsx:explore x"})
	require.Nil(t, st, "the Claude slash commands are not Codex prompts")
}

func TestCustomBlocksAreResponsesOnly(t *testing.T) {
	s, err := ParseScript([]byte(responsesScript))
	require.NoError(t, err)
	_, err = s.Stages[0].Turns[0].render(map[string]string{"workspace": "/w", "change": "c"})
	require.ErrorContains(t, err, "only in the Responses API")

	_, err = ParseScript([]byte("stages:\n  - match: x\n    turns:\n      - - custom: {input: x}\n"))
	require.ErrorContains(t, err, "custom without a name")
	_, err = ParseScript([]byte("stages:\n  - match: x\n    turns:\n      - - text: a\n          custom: {name: n, input: x}\n"))
	require.ErrorContains(t, err, "set exactly one of text, tool_use and custom")
}
