package modelproxy

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"strings"
	"sync"
	"time"
)

// DummyKey is the API key the agent CLIs are given: the forwarder drops it, and it opens
// nothing anywhere.
const DummyKey = "taskrunner-model-proxy"

// RefusalHeader is the control plane proxy's mark on its own refusals
// (services/modelproxy.RefusalHeader); "budget" means the task's budget is spent.
const RefusalHeader = "X-Taskrunner-Refusal"

// Forwarder is the loopback listener.
type Forwarder struct {
	srv  *http.Server
	ln   net.Listener
	done chan struct{}

	mu      sync.Mutex
	refused chan struct{} // closed at the first budget refusal
	reason  string
}

// Start listens on 127.0.0.1:0 and forwards to https://addr with tlsCfg (the task certificate
// and the CA that verifies the control plane).
func Start(addr string, tlsCfg *tls.Config, log *slog.Logger) (*Forwarder, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	f := &Forwarder{ln: ln, done: make(chan struct{}), refused: make(chan struct{})}
	rp := &httputil.ReverseProxy{
		Transport: &http.Transport{TLSClientConfig: tlsCfg, ForceAttemptHTTP2: true, MaxIdleConnsPerHost: 8,
			IdleConnTimeout: 90 * time.Second, TLSHandshakeTimeout: 15 * time.Second},
		// Streams are relayed as they come (server-sent events).
		FlushInterval: -1,
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme, pr.Out.URL.Host = "https", addr
			pr.Out.Host = addr
			// The dummy key stays here; the control plane adds the real one.
			pr.Out.Header.Del("Authorization")
			pr.Out.Header.Del("X-Api-Key")
		},
		ModifyResponse: func(resp *http.Response) error {
			if resp.Header.Get(RefusalHeader) == "budget" {
				f.budgetRefused(resp)
			}
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			log.Warn("model proxy unreachable", "error", err)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadGateway)
			_, _ = io.WriteString(w, `{"type":"error","error":{"type":"api_error","message":"the control plane's model proxy is unreachable"}}`)
		},
	}
	f.srv = &http.Server{Handler: rp, ReadHeaderTimeout: 30 * time.Second}
	go func() {
		defer close(f.done)
		if err := f.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("model forwarder stopped", "error", err)
		}
	}()
	return f, nil
}

// budgetRefused records the first budget refusal with the proxy's message.
func (f *Forwarder) budgetRefused(resp *http.Response) {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	resp.Body = io.NopCloser(strings.NewReader(string(b)))
	resp.ContentLength = int64(len(b))
	resp.Header.Del("Content-Length")
	f.mu.Lock()
	defer f.mu.Unlock()
	select {
	case <-f.refused:
	default:
		f.reason = refusalMessage(b)
		close(f.refused)
	}
}

// URL is the forwarder's base URL (http://127.0.0.1:port).
func (f *Forwarder) URL() string { return "http://" + f.ln.Addr().String() }

// AnthropicBaseURL is Claude Code's ANTHROPIC_BASE_URL.
func (f *Forwarder) AnthropicBaseURL() string { return f.URL() + "/anthropic" }

// OpenAIBaseURL is Codex's provider base_url.
func (f *Forwarder) OpenAIBaseURL() string { return f.URL() + "/openai/v1" }

// BudgetRefused is closed once the control plane refused a call because the task's budget
// is spent; Reason then says why.
func (f *Forwarder) BudgetRefused() <-chan struct{} { return f.refused }

// Reason is the control plane's message for the budget refusal ("" before one).
func (f *Forwarder) Reason() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.reason
}

// Close stops the listener and waits for it.
func (f *Forwarder) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := f.srv.Shutdown(ctx)
	if err != nil {
		_ = f.srv.Close()
	}
	<-f.done
	return err
}

// AgentEnv rewrites an agent CLI's environment to use the forwarder: every model credential
// or endpoint it held is dropped, and Claude Code gets ANTHROPIC_BASE_URL and the dummy key.
func (f *Forwarder) AgentEnv(env []string) []string {
	out := make([]string, 0, len(env)+2)
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		switch k {
		case "ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_BASE_URL", "CLAUDE_CODE_OAUTH_TOKEN",
			"OPENAI_API_KEY", "OPENAI_BASE_URL":
			continue
		}
		out = append(out, kv)
	}
	return append(out, "ANTHROPIC_BASE_URL="+f.AnthropicBaseURL(), "ANTHROPIC_API_KEY="+DummyKey)
}
