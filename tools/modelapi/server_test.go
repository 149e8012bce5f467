package modelapi

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/taskrunner/taskrunner/platform/testkit"
)

type sseEvent struct {
	Name string
	Data map[string]any
}

func parseSSE(t *testing.T, r io.Reader) []sseEvent {
	t.Helper()
	msgs, err := testkit.NewSSEReader(r).Events()
	require.NoError(t, err)
	evs := make([]sseEvent, 0, len(msgs))
	for _, m := range msgs {
		require.NotEmpty(t, m.Event)
		require.False(t, m.HasID || m.Retry != "", "unexpected SSE field in %+v", m)
		var ev sseEvent
		ev.Name = m.Event
		require.NoError(t, json.Unmarshal([]byte(m.Data), &ev.Data))
		require.Equal(t, ev.Name, ev.Data["type"], "event name and data type agree")
		evs = append(evs, ev)
	}
	return evs
}

func names(evs []sseEvent) []string {
	out := make([]string, len(evs))
	for i, e := range evs {
		out[i] = e.Name
	}
	return out
}

// assembled rebuilds the content blocks from the deltas, the way a client does.
func assembled(t *testing.T, evs []sseEvent) (texts []string, inputs []map[string]any) {
	t.Helper()
	var buf strings.Builder
	for _, e := range evs {
		switch e.Name {
		case "content_block_start":
			buf.Reset()
		case "content_block_delta":
			d := e.Data["delta"].(map[string]any)
			switch d["type"] {
			case "text_delta":
				buf.WriteString(d["text"].(string))
			case "input_json_delta":
				buf.WriteString(d["partial_json"].(string))
			default:
				t.Fatalf("unknown delta %v", d)
			}
		case "content_block_stop":
			s := buf.String()
			if strings.HasPrefix(s, "{") {
				var in map[string]any
				require.NoError(t, json.Unmarshal([]byte(s), &in))
				inputs = append(inputs, in)
			} else {
				texts = append(texts, s)
			}
		}
	}
	return texts, inputs
}

func TestWriteSSE(t *testing.T) {
	long := strings.Repeat("é", 200) // 400 bytes: two text deltas, split on a rune boundary
	stop := "tool_use"
	msg := message{
		ID: "msg_1", Type: "message", Role: "assistant", Model: "m",
		Content: []contentBlock{
			{Type: "text", Text: long},
			{Type: "tool_use", ID: "toolu_1", Name: "Write", Input: map[string]any{"file_path": "/w/a", "content": strings.Repeat("x", 300)}},
		},
		StopReason: &stop,
		Usage:      apiUsage{InputTokens: 7, OutputTokens: 9},
	}
	var buf bytes.Buffer
	flushes := 0
	require.NoError(t, writeSSE(&buf, func() { flushes++ }, msg))
	evs := parseSSE(t, &buf)
	require.Equal(t, []string{
		"message_start",
		"content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",
		"content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",
		"message_delta", "message_stop",
	}, names(evs))
	require.Equal(t, len(evs), flushes, "flushed after every event")

	start := evs[0].Data["message"].(map[string]any)
	require.Equal(t, "msg_1", start["id"])
	require.Equal(t, "assistant", start["role"])
	require.Empty(t, start["content"])
	require.Nil(t, start["stop_reason"])
	require.EqualValues(t, 7, start["usage"].(map[string]any)["input_tokens"])

	require.Equal(t, map[string]any{"type": "text", "text": ""}, evs[1].Data["content_block"])
	require.Equal(t, map[string]any{"type": "tool_use", "id": "toolu_1", "name": "Write", "input": map[string]any{}}, evs[5].Data["content_block"])
	require.EqualValues(t, 1, evs[5].Data["index"])

	texts, inputs := assembled(t, evs)
	require.Equal(t, []string{long}, texts)
	require.Equal(t, []map[string]any{{"file_path": "/w/a", "content": strings.Repeat("x", 300)}}, inputs)

	md := evs[9].Data
	require.Equal(t, "tool_use", md["delta"].(map[string]any)["stop_reason"])
	require.EqualValues(t, 9, md["usage"].(map[string]any)["output_tokens"])
}

func TestChunks(t *testing.T) {
	for _, tc := range []struct {
		in   string
		n    int
		want []string
	}{
		{"", 4, []string{""}},
		{"abc", 4, []string{"abc"}},
		{"abcdefgh", 4, []string{"abcd", "efgh"}},
		{"abcdefghi", 4, []string{"abcd", "efgh", "i"}},
		{"aéé", 2, []string{"a", "é", "é"}}, // never cut inside a rune
	} {
		require.Equal(t, tc.want, chunks(tc.in, tc.n), "chunks(%q, %d)", tc.in, tc.n)
	}
}

func TestParseScript(t *testing.T) {
	for _, tc := range []struct {
		name, yaml, err string
	}{
		{"ok", "stages:\n- match: x\n  turns:\n  - - text: hi\n", ""},
		{"mapping turn", "stages:\n- match: x\n  turns:\n  - blocks:\n    - text: hi\n  - error: {status: 529}\n", ""},
		{"no stages", "vars: {a: b}\n", "no stages"},
		{"bad regexp", "stages:\n- match: '('\n  turns:\n  - - text: hi\n", "match"},
		{"no turns", "stages:\n- match: x\n", "no turns"},
		{"empty turn", "stages:\n- match: x\n  turns:\n  - []\n", "empty turn"},
		{"both fields", "stages:\n- match: x\n  turns:\n  - - text: hi\n      tool_use: {name: Read}\n", "exactly one"},
		{"tool without name", "stages:\n- match: x\n  turns:\n  - - tool_use: {input: {a: 1}}\n", "without a name"},
		{"bad status", "stages:\n- match: x\n  turns:\n  - error: {status: 200}\n", "not an HTTP error"},
		{"blocks and error", "stages:\n- match: x\n  turns:\n  - {blocks: [{text: hi}], error: {status: 500}}\n", "not both"},
		{"unknown field", "stages:\n- match: x\n  turnz: []\n", "turnz"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := ParseScript([]byte(tc.yaml))
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, "stage1", s.Stages[0].Name)
		})
	}
}

// conversation helpers shaped like what Claude Code 2.1.328 sends.
func userBlocks(bs ...map[string]any) map[string]any {
	return map[string]any{"role": "user", "content": bs}
}
func text(s string) map[string]any { return map[string]any{"type": "text", "text": s} }
func toolResult(id, content string) map[string]any {
	return map[string]any{"type": "tool_result", "tool_use_id": id, "content": content}
}
func assistant(bs ...map[string]any) map[string]any {
	return map[string]any{"role": "assistant", "content": bs}
}

const reminder = "<system-reminder>\nAs you answer the user's questions…\n</system-reminder>"

func slash(cmd, args, body string) []map[string]any {
	return []map[string]any{
		text(reminder),
		text("<command-message>" + strings.TrimPrefix(cmd, "/") + "</command-message>\n<command-name>" + cmd +
			"</command-name>\n<command-args>" + args + "</command-args>\n"),
		text(body),
	}
}

var envMessage = map[string]any{"role": "system", "content": "# Environment\n - Primary working directory: /tmp/w s\n - Is a git repository: true\n"}

func TestReadPrompt(t *testing.T) {
	explore := userBlocks(slash("/opsx:explore", "Add a flag", "Enter explore mode.")...)
	propose := userBlocks(slash("/opsx:propose", "Add a flag", "Propose a new change.")...)
	for _, tc := range []struct {
		name     string
		messages []map[string]any
		want     Prompt
	}{
		{
			name:     "plain string prompt",
			messages: []map[string]any{{"role": "user", "content": "hello there"}},
			want:     Prompt{Text: "hello there", LastUserText: "hello there"},
		},
		{
			name:     "first request of a slash command",
			messages: []map[string]any{explore, envMessage},
			want: Prompt{
				Text:         "/opsx:explore Add a flag\n<command-message>opsx:explore</command-message>\n<command-name>/opsx:explore</command-name>\n<command-args>Add a flag</command-args>\n\nEnter explore mode.",
				LastUserText: "<command-message>opsx:explore</command-message>\n<command-name>/opsx:explore</command-name>\n<command-args>Add a flag</command-args>\n\nEnter explore mode.",
				Workspace:    "/tmp/w s",
			},
		},
		{
			name: "after a tool round trip",
			messages: []map[string]any{explore, envMessage,
				assistant(text("Reading."), map[string]any{"type": "tool_use", "id": "t1", "name": "Read", "input": map[string]any{}}),
				userBlocks(toolResult("t1", "1\t#!/bin/sh"), text(reminder)),
			},
			want: Prompt{Turn: 1, LastUserText: "1\t#!/bin/sh", Workspace: "/tmp/w s"},
		},
		{
			name: "resumed session with a second command",
			messages: []map[string]any{explore, envMessage,
				assistant(text("Summary.")),
				propose,
				assistant(map[string]any{"type": "tool_use", "id": "t2", "name": "Bash", "input": map[string]any{}}),
				userBlocks(toolResult("t2", "created")),
				assistant(map[string]any{"type": "tool_use", "id": "t3", "name": "Write", "input": map[string]any{}}),
				userBlocks(map[string]any{"type": "tool_result", "tool_use_id": "t3", "content": []any{text("written")}}),
			},
			want: Prompt{Turn: 2, LastUserText: "written", Workspace: "/tmp/w s",
				History: "user: <command-message>opsx:explore</command-message>\n<command-name>/opsx:explore</command-name>\n<command-args>Add a flag</command-args>\n\nEnter explore mode.\n" +
					"system: # Environment\n - Primary working directory: /tmp/w s\n - Is a git repository: true\n\nassistant: Summary."},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := json.Marshal(map[string]any{"model": "m", "messages": tc.messages})
			require.NoError(t, err)
			var req apiRequest
			require.NoError(t, json.Unmarshal(b, &req))
			got := readPrompt(&req)
			if tc.want.Text == "" { // only check the start for the long command texts
				tc.want.Text = got.Text
				require.NotEmpty(t, got.Text)
			}
			require.Equal(t, tc.want, got)
		})
	}
}

func TestDemoScriptMatchesTheFourStages(t *testing.T) {
	s, err := LoadScript("../demo/claude-demo.yaml")
	require.NoError(t, err)
	for _, tc := range []struct {
		prompt, stage, change string
	}{
		{"/opsx:explore Add a --farewell flag to greet\n…", "explore", "add-farewell"},
		{"/opsx:propose Add a --farewell flag to greet\n…", "propose", "add-farewell"},
		{"/opsx:apply add-other\n…", "apply", "add-other"},
		{"/opsx:archive add-farewell\n…", "archive", "add-farewell"},
	} {
		st, vars := s.match(Prompt{Text: tc.prompt, Workspace: "/w"})
		require.NotNil(t, st, tc.prompt)
		require.Equal(t, tc.stage, st.Name)
		require.Equal(t, tc.change, vars["change"])
		require.Equal(t, "/w", vars["workspace"])
		for i, turn := range st.Turns {
			_, err := turn.render(vars)
			require.NoError(t, err, "stage %s turn %d renders", st.Name, i)
		}
	}
	st, _ := s.match(Prompt{Text: "/opsx:sync x"})
	require.Nil(t, st)
}

const testScript = `
vars: {change: demo}
stages:
  - name: write
    match: '^/opsx:propose (?P<change>\S+)'
    usage: {input_tokens: 11, output_tokens: 22}
    turns:
      - - text: "Writing {{.change}}."
        - tool_use: {name: Write, input: {file_path: "{{.workspace}}/openspec/changes/{{.change}}/proposal.md", content: "# {{.change}}", n: 3, list: ["{{.change}}", 1]}}
      - - text: "Done."
  - name: flaky
    match: '^overloaded'
    turns:
      - error: {status: 529, message: "Overloaded"}
  - name: fatal
    match: '^fatal'
    turns:
      - error: {status: 500, type: api_error, message: "boom", no_retry: true}
`

func newTestServer(t *testing.T) (*Server, *httptest.Server) {
	t.Helper()
	s, err := ParseScript([]byte(testScript))
	require.NoError(t, err)
	srv := New(s, slog.New(slog.NewTextHandler(io.Discard, nil)))
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	return srv, hs
}

func post(t *testing.T, url string, body any) (*http.Response, []byte) {
	t.Helper()
	b, err := json.Marshal(body)
	require.NoError(t, err)
	resp, err := http.Post(url, "application/json", bytes.NewReader(b))
	require.NoError(t, err)
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, out
}

func proposeRequest(stream bool, extra ...map[string]any) map[string]any {
	msgs := append([]map[string]any{userBlocks(slash("/opsx:propose", "add-x", "Propose a new change.")...), envMessage}, extra...)
	return map[string]any{"model": "claude-test", "max_tokens": 128000, "stream": stream, "messages": msgs}
}

func TestServerStreamsScriptedTurns(t *testing.T) {
	srv, hs := newTestServer(t)

	resp, body := post(t, hs.URL+"/v1/messages?beta=true", proposeRequest(true))
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
	evs := parseSSE(t, bytes.NewReader(body))
	require.Equal(t, "message_start", evs[0].Name)
	require.Equal(t, "claude-test", evs[0].Data["message"].(map[string]any)["model"])
	require.Equal(t, "message_stop", evs[len(evs)-1].Name)
	md := evs[len(evs)-2].Data
	require.Equal(t, "tool_use", md["delta"].(map[string]any)["stop_reason"])
	require.EqualValues(t, 22, md["usage"].(map[string]any)["output_tokens"])
	texts, inputs := assembled(t, evs)
	require.Equal(t, []string{"Writing add-x."}, texts, "named group overrides vars")
	require.Equal(t, []map[string]any{{
		"file_path": "/tmp/w s/openspec/changes/add-x/proposal.md",
		"content":   "# add-x",
		"n":         float64(3),
		"list":      []any{"add-x", float64(1)},
	}}, inputs)

	// Second turn, plain JSON this time.
	resp, body = post(t, hs.URL+"/v1/messages", proposeRequest(false,
		assistant(map[string]any{"type": "tool_use", "id": "t1", "name": "Write", "input": map[string]any{}}),
		userBlocks(toolResult("t1", "File created"))))
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var msg map[string]any
	require.NoError(t, json.Unmarshal(body, &msg))
	require.Equal(t, "message", msg["type"])
	require.Equal(t, "end_turn", msg["stop_reason"])
	require.Equal(t, []any{map[string]any{"type": "text", "text": "Done."}}, msg["content"])
	require.Equal(t, map[string]any{"input_tokens": float64(11), "output_tokens": float64(22),
		"cache_creation_input_tokens": float64(0), "cache_read_input_tokens": float64(0)}, msg["usage"])

	reqs := srv.Requests()
	require.Len(t, reqs, 2)
	require.Equal(t, Request{Method: "POST", Path: "/v1/messages?beta=true", Stage: "write", Turn: 0, Status: 200, Stream: true, Prompt: "/opsx:propose add-x", InputTokens: 11, OutputTokens: 22}, reqs[0])
	require.Equal(t, Request{Method: "POST", Path: "/v1/messages", Stage: "write", Turn: 1, Status: 200, Prompt: "/opsx:propose add-x", InputTokens: 11, OutputTokens: 22}, reqs[1])
}

func TestServerUnscriptedAndErrors(t *testing.T) {
	srv, hs := newTestServer(t)
	errBody := func(body []byte) map[string]any {
		var m map[string]any
		require.NoError(t, json.Unmarshal(body, &m))
		require.Equal(t, "error", m["type"])
		return m["error"].(map[string]any)
	}

	long := strings.Repeat("a", 300)
	resp, body := post(t, hs.URL+"/v1/messages?beta=true", map[string]any{"stream": true,
		"messages": []map[string]any{{"role": "user", "content": "hello " + long}}})
	require.Equal(t, http.StatusBadRequest, resp.StatusCode)
	require.Equal(t, map[string]any{"type": "invalid_request_error",
		"message": "modelapi: no scripted answer for: " + ("hello " + long)[:200]}, errBody(body))

	// More turns than scripted.
	resp, body = post(t, hs.URL+"/v1/messages", proposeRequest(true,
		assistant(text("one")), userBlocks(toolResult("t1", "r1")),
		assistant(text("two")), userBlocks(toolResult("t2", "last result"))))
	require.Equal(t, http.StatusBadRequest, resp.StatusCode)
	e := errBody(body)
	require.Equal(t, "invalid_request_error", e["type"])
	require.Equal(t, `modelapi: no scripted answer for: last result [stage "write" has 2 turns, turn 2 requested]`, e["message"])

	resp, body = post(t, hs.URL+"/v1/messages", map[string]any{"messages": []map[string]any{{"role": "user", "content": "overloaded now"}}})
	require.Equal(t, 529, resp.StatusCode)
	require.Equal(t, map[string]any{"type": "overloaded_error", "message": "Overloaded"}, errBody(body))
	require.Empty(t, resp.Header.Get("x-should-retry"))

	resp, body = post(t, hs.URL+"/v1/messages", map[string]any{"messages": []map[string]any{{"role": "user", "content": "fatal"}}})
	require.Equal(t, 500, resp.StatusCode)
	require.Equal(t, "false", resp.Header.Get("x-should-retry"))
	require.Equal(t, map[string]any{"type": "api_error", "message": "boom"}, errBody(body))

	resp, body = post(t, hs.URL+"/v1/messages", "not an object")
	require.Equal(t, http.StatusBadRequest, resp.StatusCode)
	require.Contains(t, errBody(body)["message"], "bad request body")

	resp, body = post(t, hs.URL+"/v1/messages/count_tokens", proposeRequest(false))
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var ct map[string]float64
	require.NoError(t, json.Unmarshal(body, &ct))
	require.Greater(t, ct["input_tokens"], 0.0)

	head, err := http.Head(hs.URL + "/api/hello")
	require.NoError(t, err)
	require.NoError(t, head.Body.Close())
	require.Equal(t, http.StatusOK, head.StatusCode)

	var got []string
	for _, r := range srv.Requests() {
		got = append(got, r.Method+" "+r.Path+" "+r.Stage+" "+http.StatusText(r.Status))
	}
	require.Equal(t, []string{
		"POST /v1/messages?beta=true  Bad Request",
		"POST /v1/messages write Bad Request",
		"POST /v1/messages flaky ",
		"POST /v1/messages fatal Internal Server Error",
		"POST /v1/messages  Bad Request",
		"POST /v1/messages/count_tokens  OK",
		"HEAD /api/hello  OK",
	}, got)
	require.Equal(t, -1, srv.Requests()[1].Turn, "no turn answered")
	require.Equal(t, 0, srv.Requests()[2].Turn)
}
