package modelapi

import (
	"encoding/json"
	"regexp"
	"strings"
)

// Prompt is what the server reads from one Messages API request.
type Prompt struct {
	// Text is the stage prompt that stages are matched against: the text of the last
	// user message that is not a tool result, without the CLI's <system-reminder>
	// blocks. When the CLI expanded a slash command, Text starts with a synthesized
	// line "/opsx:propose <args>" followed by the expanded command file.
	Text string
	// Turn is the number of assistant messages after that user message: the index
	// of the scripted turn to answer with.
	Turn int
	// LastUserText is the text of the last user message (tool results included),
	// quoted in "no scripted answer" errors.
	LastUserText string
	// Workspace is the CLI's working directory ("Primary working directory: …").
	Workspace string
	// History is the text of the conversation before the stage prompt (every message's text
	// and tool results): empty for a new conversation, the earlier stages and runs for a
	// resumed one.
	History string
}

type apiRequest struct {
	Model    string          `json:"model"`
	Stream   bool            `json:"stream"`
	System   json.RawMessage `json:"system"`
	Messages []apiMessage    `json:"messages"`
}

type apiMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

type apiBlock struct {
	Type    string          `json:"type"`
	Text    string          `json:"text"`
	Content json.RawMessage `json:"content"` // tool_result: string or blocks
}

// blocks decodes message content, which is either a string or a list of blocks.
func blocks(raw json.RawMessage) []apiBlock {
	if len(raw) == 0 {
		return nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return []apiBlock{{Type: "text", Text: s}}
	}
	var bs []apiBlock
	_ = json.Unmarshal(raw, &bs)
	return bs
}

func isReminder(text string) bool {
	return strings.HasPrefix(strings.TrimSpace(text), "<system-reminder>")
}

var (
	workspaceRE = regexp.MustCompile(`Primary working directory: *([^\n]+)`)
	commandRE   = regexp.MustCompile(`(?s)<command-name>([^<]*)</command-name>\s*(?:<command-args>(.*?)</command-args>)?`)
)

// readPrompt extracts the stage prompt and turn index from a request.
func readPrompt(req *apiRequest) Prompt {
	var p Prompt
	for _, raw := range append([]json.RawMessage{req.System}, contents(req.Messages)...) {
		for _, b := range blocks(raw) {
			if m := workspaceRE.FindStringSubmatch(b.Text); m != nil {
				p.Workspace = strings.TrimSpace(m[1])
				break
			}
		}
		if p.Workspace != "" {
			break
		}
	}

	promptAt := -1
	for i := len(req.Messages) - 1; i >= 0; i-- {
		m := req.Messages[i]
		if m.Role != "user" {
			continue
		}
		bs := blocks(m.Content)
		if p.LastUserText == "" {
			p.LastUserText = userText(bs, true)
		}
		if hasToolResult(bs) {
			continue
		}
		if txt := userText(bs, false); txt != "" {
			p.Text = withCommandLine(txt)
			promptAt = i
			break
		}
	}
	for _, m := range req.Messages[promptAt+1:] {
		if m.Role == "assistant" {
			p.Turn++
		}
	}
	if promptAt > 0 {
		var hist []string
		for _, m := range req.Messages[:promptAt] {
			if t := userText(blocks(m.Content), true); t != "" {
				hist = append(hist, m.Role+": "+t)
			}
		}
		p.History = strings.Join(hist, "\n")
	}
	return p
}

func contents(ms []apiMessage) []json.RawMessage {
	out := make([]json.RawMessage, len(ms))
	for i, m := range ms {
		out[i] = m.Content
	}
	return out
}

func hasToolResult(bs []apiBlock) bool {
	for _, b := range bs {
		if b.Type == "tool_result" {
			return true
		}
	}
	return false
}

// userText joins the text blocks of a user message, skipping system reminders; with
// results it also includes the text of tool results.
func userText(bs []apiBlock, results bool) string {
	var parts []string
	for _, b := range bs {
		switch {
		case b.Type == "text" && !isReminder(b.Text):
			parts = append(parts, b.Text)
		case b.Type == "tool_result" && results:
			for _, c := range blocks(b.Content) {
				if c.Type == "text" {
					parts = append(parts, c.Text)
				}
			}
		}
	}
	return strings.Join(parts, "\n")
}

// withCommandLine puts "/name args" in front of an expanded slash command, so a
// script can match `^/opsx:apply (?P<change>\S+)` however the CLI wraps it.
func withCommandLine(text string) string {
	m := commandRE.FindStringSubmatch(text)
	if m == nil {
		return text
	}
	line := strings.TrimSpace(m[1])
	if args := strings.TrimSpace(m[2]); args != "" {
		line += " " + args
	}
	return line + "\n" + text
}
