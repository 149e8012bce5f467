package codex

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// Event is one parsed JSONL line of `codex exec --json`. Type is "thread.started",
// "turn.started", "turn.completed", "turn.failed", "item.started", "item.updated",
// "item.completed", "error" or whatever else the CLI prints (callers ignore types they do not
// know).
type Event struct {
	Type string
	// ThreadID of thread.started.
	ThreadID string
	// Item of item.started/updated/completed.
	Item *Item
	// Usage of turn.completed.
	Usage *Usage
	// Message of turn.failed (error.message) and error.
	Message string
}

// Item is a thread item: "agent_message", "reasoning", "command_execution", "file_change",
// "mcp_tool_call", "web_search", "todo_list", "error" or another type.
type Item struct {
	ID   string
	Type string
	// Text of agent_message and reasoning; Message of an error item.
	Text string
	// Command, Output (aggregated_output), ExitCode (nil while running) of command_execution.
	Command  string
	Output   string
	ExitCode *int
	// Status: in_progress, completed, failed or declined.
	Status string
	// Changes of file_change.
	Changes []Change
	// Server and Tool of mcp_tool_call; Query of web_search.
	Server, Tool, Query string
	// Todos of todo_list.
	Todos []Todo
}

// Change is one file of a file_change.
type Change struct {
	Path string
	// Kind is add, delete or update.
	Kind string
}

// Todo is one entry of a todo_list.
type Todo struct {
	Text      string
	Completed bool
}

// Usage is the token usage turn.completed reports: the sum over the model requests of the
// thread so far (a resumed thread's figures include the earlier invocations). InputTokens
// includes CachedInputTokens; OutputTokens includes ReasoningOutputTokens (OpenAI's
// accounting).
type Usage struct {
	InputTokens           int64
	CachedInputTokens     int64
	OutputTokens          int64
	ReasoningOutputTokens int64
}

type wireEvent struct {
	Type     string          `json:"type"`
	ThreadID string          `json:"thread_id"`
	Item     json.RawMessage `json:"item"`
	Usage    *struct {
		InputTokens           int64 `json:"input_tokens"`
		CachedInputTokens     int64 `json:"cached_input_tokens"`
		OutputTokens          int64 `json:"output_tokens"`
		ReasoningOutputTokens int64 `json:"reasoning_output_tokens"`
	} `json:"usage"`
	Message string          `json:"message"`
	Error   json.RawMessage `json:"error"`
}

type wireItem struct {
	ID               string `json:"id"`
	Type             string `json:"type"`
	Text             string `json:"text"`
	Message          string `json:"message"`
	Command          string `json:"command"`
	AggregatedOutput string `json:"aggregated_output"`
	ExitCode         *int   `json:"exit_code"`
	Status           string `json:"status"`
	Changes          []struct {
		Path string `json:"path"`
		Kind string `json:"kind"`
	} `json:"changes"`
	Server string `json:"server"`
	Tool   string `json:"tool"`
	Query  string `json:"query"`
	Items  []struct {
		Text      string `json:"text"`
		Completed bool   `json:"completed"`
	} `json:"items"`
}

// ErrMalformed is returned for a line that is not a JSON object with a type.
var ErrMalformed = errors.New("malformed codex JSONL line")

// ParseLine parses one line of `codex exec --json`. Unknown types are returned with only
// Type set; a line that is not a JSON object with a "type" is ErrMalformed.
func ParseLine(line []byte) (Event, error) {
	var w wireEvent
	if err := json.Unmarshal(line, &w); err != nil {
		return Event{}, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	if w.Type == "" {
		return Event{}, fmt.Errorf("%w: no type", ErrMalformed)
	}
	ev := Event{Type: w.Type}
	switch w.Type {
	case "thread.started":
		ev.ThreadID = w.ThreadID
	case "turn.completed":
		if w.Usage != nil {
			ev.Usage = &Usage{
				InputTokens: w.Usage.InputTokens, CachedInputTokens: w.Usage.CachedInputTokens,
				OutputTokens: w.Usage.OutputTokens, ReasoningOutputTokens: w.Usage.ReasoningOutputTokens,
			}
		} else {
			ev.Usage = &Usage{}
		}
	case "turn.failed":
		ev.Message = errorMessage(w.Error)
		if ev.Message == "" {
			ev.Message = w.Message
		}
		ev.Message = readable(ev.Message)
	case "error":
		ev.Message = w.Message
		if ev.Message == "" {
			ev.Message = errorMessage(w.Error)
		}
		ev.Message = readable(ev.Message)
	case "item.started", "item.updated", "item.completed":
		if len(w.Item) == 0 {
			return Event{}, fmt.Errorf("%w: %s without an item", ErrMalformed, w.Type)
		}
		var wi wireItem
		if err := json.Unmarshal(w.Item, &wi); err != nil {
			return Event{}, fmt.Errorf("%w: item: %v", ErrMalformed, err)
		}
		it := &Item{
			ID: wi.ID, Type: wi.Type, Text: wi.Text, Command: wi.Command, Output: wi.AggregatedOutput,
			ExitCode: wi.ExitCode, Status: wi.Status, Server: wi.Server, Tool: wi.Tool, Query: wi.Query,
		}
		if wi.Type == "error" && it.Text == "" {
			it.Text = wi.Message
		}
		for _, c := range wi.Changes {
			it.Changes = append(it.Changes, Change{Path: c.Path, Kind: c.Kind})
		}
		for _, t := range wi.Items {
			it.Todos = append(it.Todos, Todo{Text: t.Text, Completed: t.Completed})
		}
		ev.Item = it
	}
	return ev, nil
}

// readable shortens a message that is a raw OpenAI error body (the CLI passes a 4xx body
// through as is) to "<type>: <message>".
func readable(msg string) string {
	t := strings.TrimSpace(msg)
	if !strings.HasPrefix(t, "{") {
		return msg
	}
	var body struct {
		Error struct {
			Type    string `json:"type"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal([]byte(t), &body) != nil || body.Error.Message == "" {
		return msg
	}
	if body.Error.Type == "" {
		return body.Error.Message
	}
	return body.Error.Type + ": " + body.Error.Message
}

// errorMessage reads {"message": …} or a plain string.
func errorMessage(raw json.RawMessage) string {
	if len(raw) == 0 {
		return ""
	}
	var e struct {
		Message string `json:"message"`
	}
	if json.Unmarshal(raw, &e) == nil && e.Message != "" {
		return e.Message
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	return string(raw)
}
