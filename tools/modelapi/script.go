package modelapi

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"
	"text/template"

	"gopkg.in/yaml.v3"
)

// Script is the parsed answer file. Its YAML form:
//
//	vars:                      # template variables, overridden by named groups of a stage's match
//	  change: add-farewell
//	stages:
//	  - name: propose
//	    match: '^/opsx:propose ' # regexp tested against the stage prompt (see Prompt)
//	    usage: {input_tokens: 1200, output_tokens: 300}   # per turn; optional
//	    turns:                 # answer N is given when the conversation already has N
//	      - - text: "Writing the proposal."                # assistant turns after the prompt
//	        - tool_use:
//	            name: Write
//	            input: {file_path: "{{.workspace}}/openspec/changes/{{.change}}/proposal.md", content: "…"}
//	      - - text: "Done."
//	      - error: {status: 529, type: overloaded_error, message: "Overloaded"}
//
// A stage's `history: '<regexp>'` asserts that its first request continues an earlier
// conversation (a resumed session): see Stage.History.
//
// A turn is either a list of blocks or a mapping with `blocks` or `error`. Strings in
// text blocks and tool inputs are Go text/template templates over the variables; the
// variable `workspace` is the CLI's working directory taken from its environment text.
//
// The same script format drives the OpenAI Responses API (POST /v1/responses, used by the
// Codex CLI): a text block becomes a `message` output item, a tool_use block a
// `function_call` item whose arguments are the JSON of its input (Codex's shell tool is
// `exec_command` with `{cmd: "…"}`), and a `custom` block a `custom_tool_call` item whose
// input is a raw string (Codex's `apply_patch`). An error with `in_stream: true` is sent
// as a `response.failed` event of an HTTP 200 stream instead of an HTTP error status.
type Script struct {
	Vars   map[string]string `yaml:"vars"`
	Stages []Stage           `yaml:"stages"`
}

// Stage answers every request whose prompt matches Match.
type Stage struct {
	Name  string `yaml:"name"`
	Match string `yaml:"match"`
	// Usage is reported for every turn of the stage so the CLI computes a cost.
	Usage *Usage `yaml:"usage"`
	Turns []Turn `yaml:"turns"`
	// History, a regexp, asserts a resumed conversation: the stage's first request must carry
	// earlier messages (before the stage prompt) that match it, or it is answered with an error
	// (HTTP 400, not retried) that fails the agent's stage.
	History string `yaml:"history"`

	re      *regexp.Regexp
	history *regexp.Regexp
}

// Usage is the token count reported for one turn.
type Usage struct {
	InputTokens  int `yaml:"input_tokens" json:"input_tokens"`
	OutputTokens int `yaml:"output_tokens" json:"output_tokens"`
	// CachedInputTokens is the part of InputTokens read from the prompt cache (Responses
	// API only: input_tokens_details.cached_tokens).
	CachedInputTokens int `yaml:"cached_input_tokens" json:"-"`
}

// defaultUsage is reported when a stage has none, so the CLI always reports a non-zero cost.
var defaultUsage = Usage{InputTokens: 100, OutputTokens: 20}

// Turn is one scripted assistant answer: content blocks, or an API error.
type Turn struct {
	Blocks []Block     `yaml:"blocks"`
	Error  *ErrorReply `yaml:"error"`
}

// Block is one content block; exactly one field is set.
type Block struct {
	Text    *string  `yaml:"text"`
	ToolUse *ToolUse `yaml:"tool_use"`
	// Custom is a freeform tool call (Responses API only).
	Custom *CustomTool `yaml:"custom"`
}

// CustomTool asks the CLI to run a freeform tool with a raw string input, e.g. Codex's
// apply_patch with a patch.
type CustomTool struct {
	Name  string `yaml:"name"`
	Input string `yaml:"input"`
}

// ToolUse asks the CLI to run one of its tools (Write, Edit, Read, Bash, …).
type ToolUse struct {
	Name  string         `yaml:"name"`
	Input map[string]any `yaml:"input"`
}

// ErrorReply scripts an API failure: an HTTP status with an Anthropic error body.
type ErrorReply struct {
	Status  int    `yaml:"status"`
	Type    string `yaml:"type"`
	Message string `yaml:"message"`
	// NoRetry sets `x-should-retry: false`, which tells the client SDK not to retry.
	NoRetry bool `yaml:"no_retry"`
	// InStream sends the error as a `response.failed` event in an HTTP 200 stream
	// (Responses API only; the Messages API answers with Status regardless).
	InStream bool `yaml:"in_stream"`
}

// UnmarshalYAML accepts both the short form (a list of blocks) and the mapping form.
func (t *Turn) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.SequenceNode {
		return n.Decode(&t.Blocks)
	}
	type plain Turn
	var p plain
	if err := n.Decode(&p); err != nil {
		return err
	}
	*t = Turn(p)
	return nil
}

// LoadScript reads and parses a script file.
func LoadScript(path string) (*Script, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	s, err := ParseScript(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return s, nil
}

// ParseScript parses and checks a script.
func ParseScript(b []byte) (*Script, error) {
	var s Script
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&s); err != nil {
		return nil, fmt.Errorf("parse script: %w", err)
	}
	if len(s.Stages) == 0 {
		return nil, errors.New("script has no stages")
	}
	for i := range s.Stages {
		st := &s.Stages[i]
		if st.Name == "" {
			st.Name = fmt.Sprintf("stage%d", i+1)
		}
		re, err := regexp.Compile(st.Match)
		if err != nil {
			return nil, fmt.Errorf("stage %q: match: %w", st.Name, err)
		}
		st.re = re
		if st.History != "" {
			if st.history, err = regexp.Compile(st.History); err != nil {
				return nil, fmt.Errorf("stage %q: history: %w", st.Name, err)
			}
		}
		if len(st.Turns) == 0 {
			return nil, fmt.Errorf("stage %q has no turns", st.Name)
		}
		for j, t := range st.Turns {
			if err := t.check(); err != nil {
				return nil, fmt.Errorf("stage %q turn %d: %w", st.Name, j, err)
			}
		}
	}
	return &s, nil
}

// WithoutHistory returns a copy of the script whose stages assert no earlier conversation:
// the same answers for an agent that starts cold.
func (s *Script) WithoutHistory() *Script {
	c := *s
	c.Stages = append([]Stage(nil), s.Stages...)
	for i := range c.Stages {
		c.Stages[i].History, c.Stages[i].history = "", nil
	}
	return &c
}

func (t Turn) check() error {
	if t.Error != nil {
		if len(t.Blocks) > 0 {
			return errors.New("a turn has either blocks or an error, not both")
		}
		if t.Error.InStream && t.Error.Status == 0 {
			return nil
		}
		if t.Error.Status < 400 || t.Error.Status > 599 {
			return fmt.Errorf("error status %d is not an HTTP error status", t.Error.Status)
		}
		return nil
	}
	if len(t.Blocks) == 0 {
		return errors.New("empty turn")
	}
	for k, b := range t.Blocks {
		switch {
		case count(b.Text != nil, b.ToolUse != nil, b.Custom != nil) != 1:
			return fmt.Errorf("block %d: set exactly one of text, tool_use and custom", k)
		case b.ToolUse != nil && b.ToolUse.Name == "":
			return fmt.Errorf("block %d: tool_use without a name", k)
		case b.Custom != nil && b.Custom.Name == "":
			return fmt.Errorf("block %d: custom without a name", k)
		}
	}
	return nil
}

func count(bs ...bool) int {
	n := 0
	for _, b := range bs {
		if b {
			n++
		}
	}
	return n
}

// match finds the first stage whose regexp matches the prompt and returns it with the
// template variables: script vars, then workspace, then the match's named groups.
func (s *Script) match(p Prompt) (*Stage, map[string]string) {
	for i := range s.Stages {
		st := &s.Stages[i]
		m := st.re.FindStringSubmatch(p.Text)
		if m == nil {
			continue
		}
		vars := make(map[string]string, len(s.Vars)+2)
		for k, v := range s.Vars {
			vars[k] = v
		}
		vars["workspace"] = p.Workspace
		for j, name := range st.re.SubexpNames() {
			if name != "" && m[j] != "" {
				vars[name] = m[j]
			}
		}
		return st, vars
	}
	return nil, nil
}

// render expands the templates of a turn's blocks.
func (t Turn) render(vars map[string]string) ([]contentBlock, error) {
	out := make([]contentBlock, 0, len(t.Blocks))
	for _, b := range t.Blocks {
		if b.Text != nil {
			txt, err := expand(*b.Text, vars)
			if err != nil {
				return nil, err
			}
			out = append(out, contentBlock{Type: "text", Text: txt})
			continue
		}
		if b.Custom != nil {
			return nil, fmt.Errorf("custom tool %s: freeform tool calls exist only in the Responses API", b.Custom.Name)
		}
		in, err := expandAny(b.ToolUse.Input, vars)
		if err != nil {
			return nil, fmt.Errorf("tool_use %s: %w", b.ToolUse.Name, err)
		}
		if in == nil {
			in = map[string]any{}
		}
		out = append(out, contentBlock{Type: "tool_use", Name: b.ToolUse.Name, Input: in})
	}
	return out, nil
}

func expand(s string, vars map[string]string) (string, error) {
	if !strings.Contains(s, "{{") {
		return s, nil
	}
	tpl, err := template.New("").Option("missingkey=error").Parse(s)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	if err := tpl.Execute(&b, vars); err != nil {
		return "", err
	}
	return b.String(), nil
}

func expandAny(v any, vars map[string]string) (any, error) {
	switch v := v.(type) {
	case string:
		return expand(v, vars)
	case map[string]any:
		if v == nil {
			return nil, nil
		}
		out := make(map[string]any, len(v))
		for k, e := range v {
			x, err := expandAny(e, vars)
			if err != nil {
				return nil, err
			}
			out[k] = x
		}
		return out, nil
	case []any:
		out := make([]any, len(v))
		for i, e := range v {
			x, err := expandAny(e, vars)
			if err != nil {
				return nil, err
			}
			out[i] = x
		}
		return out, nil
	default:
		return v, nil
	}
}
