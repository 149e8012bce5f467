package modelapi

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
)

// The OpenAI Responses API (POST /v1/responses) as the Codex CLI uses it: every request
// carries the whole conversation as input items (`message` with role developer/user/
// assistant, `function_call`, `function_call_output`, `custom_tool_call`, …) and is
// answered with one model turn, streamed as server-sent events.

type responsesRequest struct {
	Model  string          `json:"model"`
	Stream bool            `json:"stream"`
	Input  json.RawMessage `json:"input"`
}

// inputItem is one conversation item of a Responses request; only what the server reads.
type inputItem struct {
	Type    string          `json:"type"`
	ID      string          `json:"id"`
	Role    string          `json:"role"`
	CallID  string          `json:"call_id"`
	Content json.RawMessage `json:"content"`
	Output  json.RawMessage `json:"output"`
}

type inputPart struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

// items decodes the input, which is either a string (a single user message) or a list.
func items(raw json.RawMessage) []inputItem {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		c, _ := json.Marshal(s)
		return []inputItem{{Type: "message", Role: "user", Content: c}}
	}
	var out []inputItem
	_ = json.Unmarshal(raw, &out)
	return out
}

// text joins the text parts of a message's content (a string or a list of parts).
func (it inputItem) text() string {
	var s string
	if json.Unmarshal(it.Content, &s) == nil {
		return s
	}
	var parts []inputPart
	_ = json.Unmarshal(it.Content, &parts)
	var out []string
	for _, p := range parts {
		if p.Text != "" {
			out = append(out, p.Text)
		}
	}
	return strings.Join(out, "\n")
}

// isMessage is true for a message item (the type may be omitted for messages).
func (it inputItem) isMessage() bool { return it.Type == "message" || (it.Type == "" && it.Role != "") }

// outputOf flattens a function_call_output's output (a string or content parts).
func (it inputItem) outputOf() string {
	var s string
	if json.Unmarshal(it.Output, &s) == nil {
		return s
	}
	var parts []inputPart
	_ = json.Unmarshal(it.Output, &parts)
	var out []string
	for _, p := range parts {
		out = append(out, p.Text)
	}
	return strings.Join(out, "\n")
}

var (
	cwdRE = regexp.MustCompile(`<cwd>([^<\n]+)</cwd>`)
	// turnRE finds the turn index the server embedded in the ids of its output items.
	turnRE = regexp.MustCompile(`_modelapi_\d+_t(\d+)_`)
)

// isContext tells user messages the CLI adds itself (environment context, expanded
// skills, AGENTS.md instructions, aborted-turn notes) from the user's prompt.
func isContext(text string) bool {
	t := strings.TrimSpace(text)
	return t == "" || strings.HasPrefix(t, "<") || strings.HasPrefix(t, "# AGENTS.md")
}

// readResponsesPrompt extracts the stage prompt, turn index and workspace from the input
// items. The prompt is the last user message that is not context the CLI added; the turn
// is the number of model turns answered after it, read from the turn index embedded in the
// ids of this server's output items, or else counted as runs of assistant output items.
func readResponsesPrompt(in []inputItem) Prompt {
	var p Prompt
	for _, it := range in {
		if it.isMessage() {
			if m := cwdRE.FindStringSubmatch(it.text()); m != nil {
				p.Workspace = strings.TrimSpace(m[1])
				break
			}
		}
	}
	promptAt := -1
	for i := len(in) - 1; i >= 0; i-- {
		it := in[i]
		switch {
		case it.Type == "function_call_output" || it.Type == "custom_tool_call_output":
			if p.LastUserText == "" {
				p.LastUserText = it.outputOf()
			}
		case it.isMessage() && it.Role == "user":
			txt := it.text()
			if p.LastUserText == "" && !isContext(txt) {
				p.LastUserText = txt
			}
			if !isContext(txt) {
				p.Text = txt
				promptAt = i
			}
		}
		if promptAt >= 0 {
			break
		}
	}
	if promptAt > 0 {
		var hist []string
		for _, it := range in[:promptAt] {
			switch {
			case it.isMessage():
				hist = append(hist, it.Role+": "+it.text())
			case it.Type == "function_call_output" || it.Type == "custom_tool_call_output":
				hist = append(hist, "tool: "+it.outputOf())
			}
		}
		p.History = strings.Join(hist, "\n")
	}
	maxTurn, runs, inRun := -1, 0, false
	for _, it := range in[promptAt+1:] {
		for _, id := range []string{it.ID, it.CallID} {
			if m := turnRE.FindStringSubmatch(id); m != nil {
				if n, err := strconv.Atoi(m[1]); err == nil && n > maxTurn {
					maxTurn = n
				}
			}
		}
		assistant := (it.isMessage() && it.Role == "assistant") || it.Type == "function_call" ||
			it.Type == "custom_tool_call" || it.Type == "reasoning"
		if assistant && !inRun {
			runs++
		}
		inRun = assistant
	}
	p.Turn = runs
	if maxTurn >= 0 {
		p.Turn = maxTurn + 1
	}
	return p
}

// responsesItem is an output item of a response.
type responsesItem map[string]any

// responsesOutput renders a turn's blocks as Responses output items; ids embed the
// sequence number n and the turn index so the next request's turn can be read back.
func responsesOutput(t Turn, vars map[string]string, n int64, turn int) ([]responsesItem, error) {
	out := make([]responsesItem, 0, len(t.Blocks))
	for i, b := range t.Blocks {
		suffix := fmt.Sprintf("_modelapi_%d_t%d_%d", n, turn, i)
		switch {
		case b.Text != nil:
			txt, err := expand(*b.Text, vars)
			if err != nil {
				return nil, err
			}
			out = append(out, responsesItem{
				"type": "message", "id": "msg" + suffix, "role": "assistant", "status": "completed",
				"content": []any{map[string]any{"type": "output_text", "text": txt, "annotations": []any{}}},
			})
		case b.ToolUse != nil:
			in, err := expandAny(b.ToolUse.Input, vars)
			if err != nil {
				return nil, fmt.Errorf("tool_use %s: %w", b.ToolUse.Name, err)
			}
			if in == nil {
				in = map[string]any{}
			}
			args, err := json.Marshal(in)
			if err != nil {
				return nil, err
			}
			out = append(out, responsesItem{
				"type": "function_call", "id": "fc" + suffix, "call_id": "call" + suffix,
				"name": b.ToolUse.Name, "arguments": string(args), "status": "completed",
			})
		case b.Custom != nil:
			in, err := expand(b.Custom.Input, vars)
			if err != nil {
				return nil, fmt.Errorf("custom %s: %w", b.Custom.Name, err)
			}
			out = append(out, responsesItem{
				"type": "custom_tool_call", "id": "ctc" + suffix, "call_id": "call" + suffix,
				"name": b.Custom.Name, "input": in, "status": "completed",
			})
		}
	}
	return out, nil
}

func responsesUsage(u Usage) map[string]any {
	return map[string]any{
		"input_tokens":          u.InputTokens,
		"input_tokens_details":  map[string]any{"cached_tokens": u.CachedInputTokens},
		"output_tokens":         u.OutputTokens,
		"output_tokens_details": map[string]any{"reasoning_tokens": 0},
		"total_tokens":          u.InputTokens + u.OutputTokens,
	}
}

// responsesError is the OpenAI error body.
func responsesError(typ, msg string) map[string]any {
	return map[string]any{"error": map[string]any{"type": typ, "code": typ, "message": msg, "param": nil}}
}

func (s *Server) responses(w http.ResponseWriter, r *http.Request, rec *Request) int {
	var req responsesRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		return writeJSON(w, http.StatusBadRequest, responsesError("invalid_request_error", "modelapi: bad request body: "+err.Error()))
	}
	rec.Stream = req.Stream
	p := readResponsesPrompt(items(req.Input))
	rec.Prompt = clip(firstLine(p.Text), 200)

	stage, vars := s.script.match(p)
	if stage == nil {
		return writeJSON(w, http.StatusBadRequest, responsesError("invalid_request_error",
			"modelapi: no scripted answer for: "+clip(p.LastUserText, 200)))
	}
	rec.Stage = stage.Name
	if p.Turn >= len(stage.Turns) {
		return writeJSON(w, http.StatusBadRequest, responsesError("invalid_request_error", fmt.Sprintf(
			"modelapi: no scripted answer for: %s [stage %q has %d turns, turn %d requested]",
			clip(p.LastUserText, 200), stage.Name, len(stage.Turns), p.Turn)))
	}
	rec.Turn = p.Turn
	if msg, ok := s.checkHistory(stage, p, rec); !ok {
		w.Header().Set("x-should-retry", "false")
		return writeJSON(w, http.StatusBadRequest, responsesError("invalid_request_error", msg))
	}
	turn := stage.Turns[p.Turn]
	n := s.seq.Add(1)
	id := fmt.Sprintf("resp_modelapi_%d", n)

	if e := turn.Error; e != nil && !e.InStream {
		typ := e.Type
		if typ == "" {
			typ = defaultErrorType(e.Status)
		}
		if e.NoRetry {
			w.Header().Set("x-should-retry", "false")
		}
		return writeJSON(w, e.Status, responsesError(typ, e.Message))
	}
	var output []responsesItem
	if turn.Error == nil {
		var err error
		if output, err = responsesOutput(turn, vars, n, p.Turn); err != nil {
			return writeJSON(w, http.StatusBadRequest, responsesError("invalid_request_error",
				fmt.Sprintf("modelapi: stage %q turn %d: %v", stage.Name, p.Turn, err)))
		}
	}
	usage := defaultUsage
	if stage.Usage != nil {
		usage = *stage.Usage
	}
	rec.InputTokens, rec.OutputTokens = int64(usage.InputTokens), int64(usage.OutputTokens)
	resp := map[string]any{
		"id": id, "object": "response", "model": req.Model, "status": "completed",
		"output": output, "usage": responsesUsage(usage),
	}
	if !req.Stream {
		if e := turn.Error; e != nil {
			return writeJSON(w, http.StatusInternalServerError, responsesError(e.Type, e.Message))
		}
		return writeJSON(w, http.StatusOK, resp)
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	flush := func() {}
	if f, ok := w.(http.Flusher); ok {
		flush = f.Flush
	}
	if err := writeResponsesSSE(w, flush, resp, turn.Error); err != nil {
		s.log.Warn("modelapi stream write failed", "err", err)
	}
	return http.StatusOK
}

// writeResponsesSSE writes a response as the Responses streaming sequence:
// response.created, then per output item response.output_item.added and
// response.output_item.done, then response.completed with the usage. With fail set it
// writes response.created and response.failed instead.
func writeResponsesSSE(w io.Writer, flush func(), resp map[string]any, fail *ErrorReply) error {
	seq := 0
	ev := func(name string, data map[string]any) error {
		data["type"] = name
		data["sequence_number"] = seq
		seq++
		b, err := json.Marshal(data)
		if err != nil {
			return err
		}
		if _, err := fmt.Fprintf(w, "event: %s\ndata: %s\n\n", name, b); err != nil {
			return err
		}
		flush()
		return nil
	}
	created := map[string]any{"id": resp["id"], "object": "response", "model": resp["model"], "status": "in_progress", "output": []any{}}
	if err := ev("response.created", map[string]any{"response": created}); err != nil {
		return err
	}
	if fail != nil {
		typ := fail.Type
		if typ == "" {
			typ = "server_error"
		}
		failed := map[string]any{"id": resp["id"], "object": "response", "model": resp["model"], "status": "failed",
			"output": []any{}, "error": map[string]any{"code": typ, "message": fail.Message}}
		return ev("response.failed", map[string]any{"response": failed})
	}
	for i, it := range resp["output"].([]responsesItem) {
		if err := ev("response.output_item.added", map[string]any{"output_index": i, "item": it}); err != nil {
			return err
		}
		if err := ev("response.output_item.done", map[string]any{"output_index": i, "item": it}); err != nil {
			return err
		}
	}
	return ev("response.completed", map[string]any{"response": resp})
}
