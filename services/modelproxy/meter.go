package modelproxy

import (
	"bytes"
	"encoding/json"
)

// Usage is what one model call consumed, as its upstream reported it. Input excludes the
// prompt-cache reads and writes, which are counted apart (they are priced apart).
type Usage struct {
	Model                                string
	Input, Output, CacheRead, CacheWrite int64
}

// TokensIn is every input token the call processed (the task's tokens_in).
func (u Usage) TokensIn() int64 { return u.Input + u.CacheRead + u.CacheWrite }

// Reported is true when the upstream reported any tokens.
func (u Usage) Reported() bool { return u.TokensIn()+u.Output > 0 }

// API is the wire protocol of an upstream.
type API int

// The upstream APIs.
const (
	Anthropic API = iota + 1 // Messages API (Claude Code)
	OpenAI                   // Responses API (Codex)
)

// anthropicUsage is Anthropic's usage object; pointers tell present fields from absent ones
// (message_delta carries cumulative counts of only some fields).
type anthropicUsage struct {
	Input      *int64 `json:"input_tokens"`
	Output     *int64 `json:"output_tokens"`
	CacheRead  *int64 `json:"cache_read_input_tokens"`
	CacheWrite *int64 `json:"cache_creation_input_tokens"`
}

func (a *anthropicUsage) applyTo(u *Usage) {
	if a == nil {
		return
	}
	set := func(dst *int64, src *int64) {
		if src != nil {
			*dst = *src
		}
	}
	set(&u.Input, a.Input)
	set(&u.Output, a.Output)
	set(&u.CacheRead, a.CacheRead)
	set(&u.CacheWrite, a.CacheWrite)
}

// openAIUsage is the Responses API's usage object; input_tokens include the cached ones.
type openAIUsage struct {
	Input   int64 `json:"input_tokens"`
	Output  int64 `json:"output_tokens"`
	Details struct {
		Cached int64 `json:"cached_tokens"`
	} `json:"input_tokens_details"`
}

func (o *openAIUsage) applyTo(u *Usage) {
	if o == nil {
		return
	}
	cached := min(o.Details.Cached, o.Input)
	u.Input, u.CacheRead, u.Output = o.Input-cached, cached, o.Output
}

// meter accumulates the usage of one response.
type meter struct {
	api   API
	usage Usage
}

// body reads the usage of a whole (non-streamed) JSON response.
func (m *meter) body(b []byte) {
	switch m.api {
	case Anthropic:
		var msg struct {
			Model string          `json:"model"`
			Usage *anthropicUsage `json:"usage"`
		}
		if json.Unmarshal(b, &msg) == nil {
			m.model(msg.Model)
			msg.Usage.applyTo(&m.usage)
		}
	case OpenAI:
		var resp struct {
			Model string       `json:"model"`
			Usage *openAIUsage `json:"usage"`
		}
		if json.Unmarshal(b, &resp) == nil {
			m.model(resp.Model)
			resp.Usage.applyTo(&m.usage)
		}
	}
}

// event reads the usage of one server-sent event's data. Anthropic streams report it in
// message_start (input, cache, first output count) and message_delta (cumulative counts);
// the Responses API in the final response.completed (or .incomplete / .failed) event.
func (m *meter) event(data []byte) {
	data = bytes.TrimSpace(data)
	if len(data) == 0 || data[0] != '{' {
		return
	}
	switch m.api {
	case Anthropic:
		var ev struct {
			Type    string `json:"type"`
			Message struct {
				Model string          `json:"model"`
				Usage *anthropicUsage `json:"usage"`
			} `json:"message"`
			Usage *anthropicUsage `json:"usage"`
		}
		if json.Unmarshal(data, &ev) != nil {
			return
		}
		switch ev.Type {
		case "message_start":
			m.model(ev.Message.Model)
			ev.Message.Usage.applyTo(&m.usage)
		case "message_delta":
			ev.Usage.applyTo(&m.usage)
		}
	case OpenAI:
		var ev struct {
			Type     string `json:"type"`
			Response struct {
				Model string       `json:"model"`
				Usage *openAIUsage `json:"usage"`
			} `json:"response"`
		}
		if json.Unmarshal(data, &ev) != nil {
			return
		}
		switch ev.Type {
		case "response.created", "response.completed", "response.incomplete", "response.failed":
			m.model(ev.Response.Model)
			ev.Response.Usage.applyTo(&m.usage)
		}
	}
}

func (m *meter) model(s string) {
	if s != "" {
		m.usage.Model = s
	}
}
