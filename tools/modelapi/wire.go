package modelapi

import (
	"encoding/json"
	"fmt"
	"io"
)

// message is an Anthropic Messages API response.
type message struct {
	ID           string         `json:"id"`
	Type         string         `json:"type"`
	Role         string         `json:"role"`
	Model        string         `json:"model"`
	Content      []contentBlock `json:"content"`
	StopReason   *string        `json:"stop_reason"`
	StopSequence *string        `json:"stop_sequence"`
	Usage        apiUsage       `json:"usage"`
}

type apiUsage struct {
	InputTokens              int `json:"input_tokens"`
	OutputTokens             int `json:"output_tokens"`
	CacheCreationInputTokens int `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     int `json:"cache_read_input_tokens"`
}

type contentBlock struct {
	Type  string `json:"type"`
	Text  string `json:"text,omitempty"`
	ID    string `json:"id,omitempty"`
	Name  string `json:"name,omitempty"`
	Input any    `json:"input,omitempty"`
}

// MarshalJSON keeps "text" on text blocks even when empty, and "input" on tool_use.
func (b contentBlock) MarshalJSON() ([]byte, error) {
	switch b.Type {
	case "text":
		return json.Marshal(struct {
			Type string `json:"type"`
			Text string `json:"text"`
		}{b.Type, b.Text})
	case "tool_use":
		return json.Marshal(struct {
			Type  string `json:"type"`
			ID    string `json:"id"`
			Name  string `json:"name"`
			Input any    `json:"input"`
		}{b.Type, b.ID, b.Name, b.Input})
	}
	type plain contentBlock
	return json.Marshal(plain(b))
}

// stopReason is tool_use when the answer asks for a tool, end_turn otherwise.
func stopReason(content []contentBlock) string {
	for _, b := range content {
		if b.Type == "tool_use" {
			return "tool_use"
		}
	}
	return "end_turn"
}

// deltaChunk is the size of the pieces text and tool input are streamed in; several
// deltas per block exercise the client's concatenation the way the real API does.
const deltaChunk = 256

// writeSSE writes msg as the Anthropic streaming event sequence: message_start, then
// per block content_block_start / content_block_delta… / content_block_stop, then
// message_delta (stop_reason, usage) and message_stop. flush is called after each event.
func writeSSE(w io.Writer, flush func(), msg message) error {
	ev := func(name string, data any) error {
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
	start := msg
	start.Content = []contentBlock{}
	start.StopReason = nil
	start.Usage.OutputTokens = 1
	if err := ev("message_start", map[string]any{"type": "message_start", "message": start}); err != nil {
		return err
	}
	for i, b := range msg.Content {
		var empty contentBlock
		var deltaType, field, payload string
		switch b.Type {
		case "tool_use":
			empty = contentBlock{Type: "tool_use", ID: b.ID, Name: b.Name, Input: map[string]any{}}
			in, err := json.Marshal(b.Input)
			if err != nil {
				return err
			}
			deltaType, field, payload = "input_json_delta", "partial_json", string(in)
		default:
			empty = contentBlock{Type: "text"}
			deltaType, field, payload = "text_delta", "text", b.Text
		}
		if err := ev("content_block_start", map[string]any{"type": "content_block_start", "index": i, "content_block": empty}); err != nil {
			return err
		}
		for _, piece := range chunks(payload, deltaChunk) {
			d := map[string]any{"type": "content_block_delta", "index": i, "delta": map[string]any{"type": deltaType, field: piece}}
			if err := ev("content_block_delta", d); err != nil {
				return err
			}
		}
		if err := ev("content_block_stop", map[string]any{"type": "content_block_stop", "index": i}); err != nil {
			return err
		}
	}
	if err := ev("message_delta", map[string]any{
		"type":  "message_delta",
		"delta": map[string]any{"stop_reason": msg.StopReason, "stop_sequence": nil},
		"usage": map[string]any{"output_tokens": msg.Usage.OutputTokens},
	}); err != nil {
		return err
	}
	return ev("message_stop", map[string]any{"type": "message_stop"})
}

// chunks splits s into pieces of at most n bytes without splitting a UTF-8 sequence.
func chunks(s string, n int) []string {
	if s == "" {
		return []string{""}
	}
	var out []string
	for len(s) > n {
		cut := n
		for cut > 0 && s[cut]&0xC0 == 0x80 { // continuation byte: back up
			cut--
		}
		if cut == 0 {
			cut = n
		}
		out = append(out, s[:cut])
		s = s[cut:]
	}
	return append(out, s)
}

// errorBody is Anthropic's error shape.
func errorBody(typ, msg string) map[string]any {
	return map[string]any{"type": "error", "error": map[string]any{"type": typ, "message": msg}}
}

func defaultErrorType(status int) string {
	switch status {
	case 400:
		return "invalid_request_error"
	case 401:
		return "authentication_error"
	case 403:
		return "permission_error"
	case 404:
		return "not_found_error"
	case 413:
		return "request_too_large"
	case 429:
		return "rate_limit_error"
	case 529:
		return "overloaded_error"
	default:
		return "api_error"
	}
}
