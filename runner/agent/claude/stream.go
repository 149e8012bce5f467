package claude

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// Message is one parsed stream-json line. Type is "system", "assistant", "user", "result" or
// whatever else the CLI prints (callers ignore types they do not know).
type Message struct {
	Type      string
	Subtype   string
	SessionID string
	// Blocks of an assistant or user message, in order.
	Blocks []Block
	// Result is set for type "result".
	Result *Result
}

// Block is one content block of an assistant or user message.
type Block struct {
	// Type is "text", "thinking", "tool_use", "tool_result" or another block type.
	Type string
	// Text of a text block, or the text content of a tool_result.
	Text string
	// ToolUseID, Name and Input of a tool_use; ToolUseID and IsError of a tool_result.
	ToolUseID string
	Name      string
	Input     map[string]any
	IsError   bool
}

// Result is the final line of an invocation.
type Result struct {
	Subtype        string
	IsError        bool
	Text           string
	TotalCostUSD   float64
	NumTurns       int
	InputTokens    int64
	OutputTokens   int64
	Errors         []string
	TerminalReason string
	StopReason     string
	APIErrorStatus int
}

// Failed is true when the CLI reports an error: is_error or a non-success subtype (an API
// failure can arrive as subtype "success" with is_error true).
func (r *Result) Failed() bool { return r.IsError || r.Subtype != "success" }

// Reason is the CLI's explanation of a failure.
func (r *Result) Reason() string {
	var parts []string
	switch r.Subtype {
	case "success", "":
	case "error_max_turns":
		parts = append(parts, fmt.Sprintf("turn cap reached (error_max_turns after %d turns)", r.NumTurns))
	case "error_max_budget_usd":
		parts = append(parts, fmt.Sprintf("budget exceeded (error_max_budget_usd, cost %.4f USD)", r.TotalCostUSD))
	default:
		parts = append(parts, r.Subtype)
	}
	if t := strings.TrimSpace(r.Text); t != "" {
		parts = append(parts, t)
	}
	parts = append(parts, r.Errors...)
	if r.APIErrorStatus != 0 && !strings.Contains(strings.Join(parts, " "), fmt.Sprint(r.APIErrorStatus)) {
		parts = append(parts, fmt.Sprintf("API status %d", r.APIErrorStatus))
	}
	if len(parts) == 0 {
		return "agent reported an error without a reason"
	}
	return strings.Join(parts, ": ")
}

// Limit is true when the CLI stopped at the turn cap or the budget.
func (r *Result) Limit() bool {
	return r.Subtype == "error_max_turns" || r.Subtype == "error_max_budget_usd"
}

type wireLine struct {
	Type      string          `json:"type"`
	Subtype   string          `json:"subtype"`
	SessionID string          `json:"session_id"`
	Message   json.RawMessage `json:"message"`

	IsError        bool            `json:"is_error"`
	Result         json.RawMessage `json:"result"`
	TotalCostUSD   *float64        `json:"total_cost_usd"`
	TotalCost      *float64        `json:"total_cost"` // before CLI 1.0.22
	NumTurns       int             `json:"num_turns"`
	Usage          *wireUsage      `json:"usage"`
	Errors         []any           `json:"errors"`
	TerminalReason string          `json:"terminal_reason"`
	StopReason     string          `json:"stop_reason"`
	APIErrorStatus *int            `json:"api_error_status"`
}

type wireUsage struct {
	InputTokens              int64 `json:"input_tokens"`
	OutputTokens             int64 `json:"output_tokens"`
	CacheCreationInputTokens int64 `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     int64 `json:"cache_read_input_tokens"`
}

type wireMessage struct {
	Content json.RawMessage `json:"content"`
}

type wireBlock struct {
	Type      string          `json:"type"`
	Text      string          `json:"text"`
	Thinking  string          `json:"thinking"`
	ID        string          `json:"id"`
	Name      string          `json:"name"`
	Input     map[string]any  `json:"input"`
	ToolUseID string          `json:"tool_use_id"`
	Content   json.RawMessage `json:"content"`
	IsError   bool            `json:"is_error"`
}

// ErrMalformed is returned for a line that is not a JSON object with a type.
var ErrMalformed = errors.New("malformed stream-json line")

// ParseLine parses one line of stream-json. Unknown types are returned with only Type (and
// Subtype, SessionID) set; a line that is not a JSON object with a "type" is ErrMalformed.
func ParseLine(line []byte) (Message, error) {
	var w wireLine
	if err := json.Unmarshal(line, &w); err != nil {
		return Message{}, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	if w.Type == "" {
		return Message{}, fmt.Errorf("%w: no type", ErrMalformed)
	}
	m := Message{Type: w.Type, Subtype: w.Subtype, SessionID: w.SessionID}
	switch w.Type {
	case "assistant", "user":
		if len(w.Message) == 0 {
			return m, nil
		}
		var wm wireMessage
		if err := json.Unmarshal(w.Message, &wm); err != nil {
			return Message{}, fmt.Errorf("%w: message: %v", ErrMalformed, err)
		}
		m.Blocks = parseContent(wm.Content)
	case "result":
		r := &Result{
			Subtype: w.Subtype, IsError: w.IsError, NumTurns: w.NumTurns,
			TerminalReason: w.TerminalReason, StopReason: w.StopReason,
		}
		switch {
		case w.TotalCostUSD != nil:
			r.TotalCostUSD = *w.TotalCostUSD
		case w.TotalCost != nil:
			r.TotalCostUSD = *w.TotalCost
		}
		if w.Usage != nil {
			r.InputTokens = w.Usage.InputTokens + w.Usage.CacheCreationInputTokens + w.Usage.CacheReadInputTokens
			r.OutputTokens = w.Usage.OutputTokens
		}
		if w.APIErrorStatus != nil {
			r.APIErrorStatus = *w.APIErrorStatus
		}
		var text string
		if json.Unmarshal(w.Result, &text) == nil {
			r.Text = text
		}
		for _, e := range w.Errors {
			switch e := e.(type) {
			case string:
				r.Errors = append(r.Errors, e)
			default:
				b, _ := json.Marshal(e)
				r.Errors = append(r.Errors, string(b))
			}
		}
		m.Result = r
	}
	return m, nil
}

// parseContent accepts a string (plain user text) or a list of blocks.
func parseContent(raw json.RawMessage) []Block {
	if len(raw) == 0 {
		return nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return []Block{{Type: "text", Text: s}}
	}
	var wbs []wireBlock
	if json.Unmarshal(raw, &wbs) != nil {
		return nil
	}
	out := make([]Block, 0, len(wbs))
	for _, wb := range wbs {
		b := Block{Type: wb.Type, Name: wb.Name, Input: wb.Input, IsError: wb.IsError}
		switch wb.Type {
		case "text":
			b.Text = wb.Text
		case "thinking":
			b.Text = wb.Thinking
		case "tool_use":
			b.ToolUseID = wb.ID
		case "tool_result":
			b.ToolUseID = wb.ToolUseID
			b.Text = contentText(wb.Content)
		}
		out = append(out, b)
	}
	return out
}

// contentText flattens a tool_result content (a string or a list of text blocks).
func contentText(raw json.RawMessage) string {
	if len(raw) == 0 {
		return ""
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var bs []wireBlock
	if json.Unmarshal(raw, &bs) != nil {
		return ""
	}
	var parts []string
	for _, b := range bs {
		if b.Type == "text" {
			parts = append(parts, b.Text)
		}
	}
	return strings.Join(parts, "\n")
}

// ToolFile returns the file a Write, Edit, MultiEdit or NotebookEdit call touches.
func (b Block) ToolFile() string {
	switch b.Name {
	case "Write", "Edit", "MultiEdit", "NotebookEdit":
		for _, k := range []string{"file_path", "notebook_path", "path"} {
			if s, ok := b.Input[k].(string); ok && s != "" {
				return s
			}
		}
	}
	return ""
}

// ToolCommand returns the shell command of a Bash call.
func (b Block) ToolCommand() string {
	if b.Name != "Bash" {
		return ""
	}
	s, _ := b.Input["command"].(string)
	return s
}
