package modelproxy

import (
	"errors"
	"fmt"
	"net"
	"net/url"
)

// Config configures the proxy. The keys come from taskrunnerd's own environment and never
// leave this process except towards their upstream.
type Config struct {
	// Addr is the HTTPS listener (mTLS, runner CA); empty disables the proxy.
	Addr string `env:"TASKRUNNER_MODEL_PROXY_ADDR"`
	// AnthropicUpstream and OpenAIUpstream are the base URLs calls are forwarded to
	// (request paths such as /v1/messages are appended).
	AnthropicUpstream string `env:"TASKRUNNER_ANTHROPIC_UPSTREAM" envDefault:"https://api.anthropic.com"`
	OpenAIUpstream    string `env:"TASKRUNNER_OPENAI_UPSTREAM" envDefault:"https://api.openai.com"`
	AnthropicKey      string `env:"ANTHROPIC_API_KEY"`
	OpenAIKey         string `env:"OPENAI_API_KEY"`
	// Prices is a JSON price table (see ParsePrices) or the path of a file holding one; its
	// entries replace or extend DefaultPrices.
	Prices string `env:"TASKRUNNER_MODEL_PRICES"`
	// MaxBudgetUSD is the most a task may spend on model calls (the server's maximum; a
	// per-task budget, once tasks carry one, is bounded by it).
	MaxBudgetUSD float64 `env:"TASKRUNNER_MAX_BUDGET_USD" envDefault:"5"`
	// TrustDomain is the SPIFFE trust domain of task certificates (set by the daemon).
	TrustDomain string
}

// Validate names the bad variable. It never prints a key.
func (c Config) Validate() error {
	if c.Addr != "" {
		if _, _, err := net.SplitHostPort(c.Addr); err != nil {
			return fmt.Errorf("TASKRUNNER_MODEL_PROXY_ADDR: want host:port, got %q", c.Addr)
		}
	}
	for name, v := range map[string]string{"TASKRUNNER_ANTHROPIC_UPSTREAM": c.AnthropicUpstream, "TASKRUNNER_OPENAI_UPSTREAM": c.OpenAIUpstream} {
		u, err := url.Parse(v)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil {
			return fmt.Errorf("%s: want an http(s) base URL without credentials, got %q", name, redactURL(v))
		}
	}
	if c.MaxBudgetUSD <= 0 {
		return errors.New("TASKRUNNER_MAX_BUDGET_USD: must be positive")
	}
	if c.TrustDomain == "" {
		return errors.New("TASKRUNNER_TRUST_DOMAIN: must not be empty")
	}
	if _, err := LoadPrices(c.Prices); err != nil {
		return fmt.Errorf("TASKRUNNER_MODEL_PRICES: %w", err)
	}
	return nil
}

// redactURL keeps a URL's scheme and host only, in case someone put a key in it.
func redactURL(v string) string {
	u, err := url.Parse(v)
	if err != nil {
		return "(unparsable)"
	}
	return u.Scheme + "://" + u.Host + "/…"
}
