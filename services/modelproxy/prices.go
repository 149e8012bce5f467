package modelproxy

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"strings"
)

// Price is what a model costs, in USD per million tokens.
type Price struct {
	Input  float64 `json:"input"`
	Output float64 `json:"output"`
	// CacheRead and CacheWrite price prompt-cache reads and writes (Anthropic's
	// cache_read_input_tokens / cache_creation_input_tokens, OpenAI's cached_tokens).
	CacheRead  float64 `json:"cache_read"`
	CacheWrite float64 `json:"cache_write"`
}

// Prices maps a model name, or a prefix of model names, to its price; "*" prices every
// other model. A model takes the entry with the longest matching prefix, so
// "claude-sonnet-4" prices "claude-sonnet-4-5-20250929".
type Prices map[string]Price

// DefaultPrices are list prices of the models the CLIs use (November 2026). The fallback "*"
// is deliberately not cheap: an unknown model must not make the budget meaningless.
func DefaultPrices() Prices {
	return Prices{
		"claude-opus-4-5":   {Input: 5, Output: 25, CacheRead: 0.5, CacheWrite: 6.25},
		"claude-opus-4":     {Input: 15, Output: 75, CacheRead: 1.5, CacheWrite: 18.75},
		"claude-sonnet-4":   {Input: 3, Output: 15, CacheRead: 0.3, CacheWrite: 3.75},
		"claude-3-7-sonnet": {Input: 3, Output: 15, CacheRead: 0.3, CacheWrite: 3.75},
		"claude-haiku-4":    {Input: 1, Output: 5, CacheRead: 0.1, CacheWrite: 1.25},
		"claude-3-5-haiku":  {Input: 0.8, Output: 4, CacheRead: 0.08, CacheWrite: 1},
		"gpt-5":             {Input: 1.25, Output: 10, CacheRead: 0.125},
		"gpt-5-mini":        {Input: 0.25, Output: 2, CacheRead: 0.025},
		"gpt-5-nano":        {Input: 0.05, Output: 0.4, CacheRead: 0.005},
		"gpt-4.1":           {Input: 2, Output: 8, CacheRead: 0.5},
		"o4-mini":           {Input: 1.1, Output: 4.4, CacheRead: 0.275},
		"*":                 {Input: 15, Output: 75, CacheRead: 1.5, CacheWrite: 18.75},
	}
}

// LoadPrices returns DefaultPrices with the entries of v applied: v is a JSON object
// ({"model": {"input": 3, "output": 15, "cache_read": 0.3, "cache_write": 3.75}}), the
// path of a file holding one, or empty.
func LoadPrices(v string) (Prices, error) {
	out := DefaultPrices()
	v = strings.TrimSpace(v)
	if v == "" {
		return out, nil
	}
	data := []byte(v)
	if !strings.HasPrefix(v, "{") {
		b, err := os.ReadFile(v)
		if err != nil {
			return nil, fmt.Errorf("not a JSON object, and not a readable file: %w", err)
		}
		data = b
	}
	var extra Prices
	if err := json.Unmarshal(data, &extra); err != nil {
		return nil, fmt.Errorf("price table: %w", err)
	}
	for m, p := range extra {
		if p.Input < 0 || p.Output < 0 || p.CacheRead < 0 || p.CacheWrite < 0 {
			return nil, fmt.Errorf("price of %q: must not be negative", m)
		}
	}
	maps.Copy(out, extra)
	return out, nil
}

// Of returns the price of model: the longest prefix entry, else "*".
func (p Prices) Of(model string) Price {
	best, found := "", false
	for k := range p {
		if k != "*" && strings.HasPrefix(model, k) && len(k) >= len(best) {
			best, found = k, true
		}
	}
	if found {
		return p[best]
	}
	return p["*"]
}

// Cost prices u.
func (p Prices) Cost(u Usage) float64 {
	pr := p.Of(u.Model)
	return (float64(u.Input)*pr.Input + float64(u.Output)*pr.Output +
		float64(u.CacheRead)*pr.CacheRead + float64(u.CacheWrite)*pr.CacheWrite) / 1e6
}
