package modelproxy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
	"github.com/taskrunner/taskrunner/services/errs"
	"github.com/taskrunner/taskrunner/services/pki"
	"github.com/taskrunner/taskrunner/services/task"
)

// Paths under which the two APIs are reached: the forwarder in the sandbox gives Claude Code
// ANTHROPIC_BASE_URL=<forwarder>/anthropic and Codex base_url=<forwarder>/openai/v1.
const (
	AnthropicPrefix = "/anthropic"
	OpenAIPrefix    = "/openai"
)

// RefusalHeader marks an answer of the proxy itself (not of the upstream) with why it
// refused: "budget" (the task's budget is spent) or "task" (the task is not running). The
// runner's forwarder turns "budget" into the salvage path (draft PR, failed: budget).
const RefusalHeader = "X-Taskrunner-Refusal"

// Limits on what passes through.
const (
	maxRequestBytes  = 64 << 20
	maxResponseBytes = 64 << 20
	maxEventBytes    = 16 << 20
	// bytesPerToken estimates a request's input tokens from its size, to refuse before
	// forwarding a call whose input alone would cross the budget.
	bytesPerToken = 4
)

// allowed are the upstream operations a sandbox may use the key for (method and path after
// the API prefix); anything else (files, batches, admin…) is refused.
var allowed = map[API]map[string]bool{
	Anthropic: {"POST /v1/messages": true, "POST /v1/messages/count_tokens": true, "GET /v1/models": true},
	OpenAI:    {"POST /v1/responses": true, "GET /v1/models": true},
}

// metered are the operations whose answers carry usage.
var metered = map[string]bool{"POST /v1/messages": true, "POST /v1/responses": true}

// Server is the proxy, an http.Handler for the mTLS listener.
type Server struct {
	cfg    Config
	prices Prices
	tasks  *task.Store
	client *http.Client
	log    *slog.Logger
	up     map[API]*url.URL
}

// New validates cfg and returns the proxy. tasks must publish what it appends
// (task.Store.WithPublisher) for SSE subscribers to see usage live; client is the upstream
// client (nil: a default transport without an overall timeout, since streams last).
func New(cfg Config, tasks *task.Store, client *http.Client, log *slog.Logger) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if tasks == nil {
		return nil, errors.New("modelproxy: a task store is required")
	}
	prices, _ := LoadPrices(cfg.Prices)
	if client == nil {
		client = &http.Client{Transport: &http.Transport{Proxy: http.ProxyFromEnvironment, ForceAttemptHTTP2: true,
			MaxIdleConnsPerHost: 16, IdleConnTimeout: 90 * time.Second, TLSHandshakeTimeout: 10 * time.Second}}
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	a, _ := url.Parse(cfg.AnthropicUpstream)
	o, _ := url.Parse(cfg.OpenAIUpstream)
	return &Server{cfg: cfg, prices: prices, tasks: tasks, client: client, log: log, up: map[API]*url.URL{Anthropic: a, OpenAI: o}}, nil
}

// ServeHTTP authenticates the task, checks that it runs and has budget left, forwards the
// call with the real key and meters the answer.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	api, path := route(r.URL.Path)
	if api == 0 {
		s.refuse(w, OpenAI, http.StatusNotFound, "", "not_found_error", "modelproxy: no such API: use /anthropic or /openai")
		return
	}
	taskID, err := s.taskOf(r)
	if err != nil {
		s.refuse(w, api, http.StatusUnauthorized, "", "authentication_error", "modelproxy: "+err.Error())
		return
	}
	op := r.Method + " " + path
	if !allowed[api][op] {
		s.refuse(w, api, http.StatusNotFound, "", "not_found_error", "modelproxy: "+op+" is not forwarded")
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxRequestBytes))
	if err != nil {
		s.refuse(w, api, http.StatusRequestEntityTooLarge, "", "request_too_large", "modelproxy: request body too large or unreadable")
		return
	}
	t, err := s.tasks.Get(r.Context(), taskID, "")
	switch {
	case errors.Is(err, errs.ErrNotFound):
		s.refuse(w, api, http.StatusForbidden, "task", "permission_error", "modelproxy: unknown task")
		return
	case err != nil:
		s.log.ErrorContext(r.Context(), "modelproxy: read task", "task_id", taskID, "error", err)
		s.refuse(w, api, http.StatusServiceUnavailable, "", "api_error", "modelproxy: the task store is unavailable; retry later")
		return
	case t.Status != task.StatusRunning:
		s.refuse(w, api, http.StatusForbidden, "task", "permission_error", fmt.Sprintf("modelproxy: task %s is %s: model calls are accepted only while it runs", taskID, t.Status))
		return
	}
	if metered[op] {
		budget, err := s.budget(r.Context(), t)
		if err != nil {
			s.log.ErrorContext(r.Context(), "modelproxy: read task budget", "task_id", taskID, "error", err)
			s.refuse(w, api, http.StatusServiceUnavailable, "", "api_error", "modelproxy: the task store is unavailable; retry later")
			return
		}
		est := s.prices.Cost(Usage{Model: modelOf(body), Input: int64(len(body) / bytesPerToken)})
		if t.Usage.CostUSD+est > budget {
			s.log.InfoContext(r.Context(), "modelproxy: budget refusal", "task_id", taskID, "spent_usd", t.Usage.CostUSD, "estimate_usd", est, "budget_usd", budget)
			s.refuse(w, api, http.StatusPaymentRequired, "budget", budgetErrorType(api), fmt.Sprintf(
				"budget exceeded: task %s has spent %.4f of its %.4f USD budget and this call needs about %.4f USD more", taskID, t.Usage.CostUSD, budget, est))
			return
		}
	}
	s.forward(w, r, api, path, body, taskID, metered[op])
}

// budget is the task's budget: the one set at create (CreateTaskRequest.max_budget_usd),
// bounded by the server's maximum, or the maximum when none was set.
func (s *Server) budget(ctx context.Context, t task.Task) (float64, error) {
	set, err := s.tasks.Budget(ctx, t.ID)
	if err != nil {
		return 0, err
	}
	return task.EffectiveBudget(set, s.cfg.MaxBudgetUSD), nil
}

// route splits the API prefix off path.
func route(p string) (API, string) {
	for prefix, api := range map[string]API{AnthropicPrefix: Anthropic, OpenAIPrefix: OpenAI} {
		if rest, ok := strings.CutPrefix(p, prefix); ok && strings.HasPrefix(rest, "/") {
			return api, rest
		}
	}
	return 0, ""
}

// taskOf returns the task named by the verified client certificate.
func (s *Server) taskOf(r *http.Request) (string, error) {
	if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 || len(r.TLS.VerifiedChains[0]) == 0 {
		return "", pki.ErrNoVerifiedCert
	}
	return pki.TaskIDFromCert(r.TLS.VerifiedChains[0][0], s.cfg.TrustDomain)
}

func modelOf(body []byte) string {
	var req struct {
		Model string `json:"model"`
	}
	_ = json.Unmarshal(body, &req)
	return req.Model
}

// dropRequest are request headers never forwarded: the sandbox's credentials (whatever it
// sent is replaced by the real key), hop-by-hop headers, and Accept-Encoding (the transport
// negotiates compression itself and hands over decoded bodies the meter can read).
var dropRequest = []string{"Authorization", "X-Api-Key", "Api-Key", "Proxy-Authorization", "Cookie", "Openai-Organization",
	"Openai-Project", "Accept-Encoding", "Connection", "Keep-Alive", "Proxy-Connection", "Te", "Trailer", "Transfer-Encoding",
	"Upgrade", "Content-Length", "Forwarded", "X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto"}

var dropResponse = []string{"Connection", "Keep-Alive", "Proxy-Connection", "Te", "Trailer", "Transfer-Encoding", "Upgrade",
	"Content-Length", "Content-Encoding", "Set-Cookie", RefusalHeader}

func (s *Server) forward(w http.ResponseWriter, r *http.Request, api API, path string, body []byte, taskID string, meterIt bool) {
	target := *s.up[api]
	target.Path = strings.TrimSuffix(target.Path, "/") + path
	target.RawQuery = r.URL.RawQuery
	out, err := http.NewRequestWithContext(r.Context(), r.Method, target.String(), bytes.NewReader(body))
	if err != nil {
		s.refuse(w, api, http.StatusBadRequest, "", "invalid_request_error", "modelproxy: bad request")
		return
	}
	out.Header = r.Header.Clone()
	for _, h := range dropRequest {
		out.Header.Del(h)
	}
	for h := range out.Header {
		if strings.HasPrefix(strings.ToLower(h), "x-taskrunner-") {
			out.Header.Del(h)
		}
	}
	switch api {
	case Anthropic:
		if s.cfg.AnthropicKey != "" {
			out.Header.Set("X-Api-Key", s.cfg.AnthropicKey)
		}
	case OpenAI:
		if s.cfg.OpenAIKey != "" {
			out.Header.Set("Authorization", "Bearer "+s.cfg.OpenAIKey)
		}
	}
	resp, err := s.client.Do(out)
	if err != nil {
		if r.Context().Err() == nil {
			// The error names the URL only; the key is in a header and never printed.
			s.log.WarnContext(r.Context(), "modelproxy: upstream unreachable", "task_id", taskID, "error", err)
		}
		s.refuse(w, api, http.StatusBadGateway, "", "api_error", "modelproxy: the model API is unreachable")
		return
	}
	defer resp.Body.Close()
	for k, vs := range resp.Header {
		w.Header()[k] = vs
	}
	for _, h := range dropResponse {
		w.Header().Del(h)
	}
	m := &meter{api: api}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		w.WriteHeader(resp.StatusCode)
		err = relayEvents(w, resp.Body, m)
	} else {
		var b []byte
		b, err = io.ReadAll(io.LimitReader(resp.Body, maxResponseBytes+1))
		if err == nil && len(b) > maxResponseBytes {
			err = errors.New("response too large")
			b = b[:maxResponseBytes]
		}
		w.WriteHeader(resp.StatusCode)
		_, _ = w.Write(b)
		if resp.StatusCode < 300 {
			m.body(b)
		}
	}
	if err != nil && r.Context().Err() == nil {
		s.log.WarnContext(r.Context(), "modelproxy: relaying the answer failed", "task_id", taskID, "error", err)
	}
	if meterIt && m.usage.Model == "" {
		m.usage.Model = modelOf(body)
	}
	if meterIt && m.usage.Reported() {
		// Recorded even when the caller went away: the upstream charged for it.
		s.record(context.WithoutCancel(r.Context()), taskID, m.usage)
	}
}

// relayEvents copies a server-sent event stream line by line, flushing after every event,
// and meters each event's data.
func relayEvents(w http.ResponseWriter, body io.Reader, m *meter) error {
	flush := func() {}
	if f, ok := w.(http.Flusher); ok {
		flush = f.Flush
	}
	br := bufio.NewReaderSize(body, 64<<10)
	var data []byte
	tooBig := false
	for {
		line, err := br.ReadBytes('\n')
		if len(line) > 0 {
			if _, werr := w.Write(line); werr != nil {
				return werr
			}
			trimmed := bytes.TrimRight(line, "\r\n")
			switch {
			case len(trimmed) == 0:
				flush()
				if !tooBig {
					m.event(data)
				}
				data, tooBig = data[:0], false
			case bytes.HasPrefix(trimmed, []byte("data:")):
				d := bytes.TrimPrefix(bytes.TrimPrefix(trimmed, []byte("data:")), []byte(" "))
				if len(data)+len(d) > maxEventBytes {
					tooBig = true
				} else {
					if len(data) > 0 {
						data = append(data, '\n')
					}
					data = append(data, d...)
				}
			}
		}
		if err != nil {
			flush()
			if len(data) > 0 && !tooBig {
				m.event(data)
			}
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
	}
}

// record adds u to the task's totals on its row and appends a usage event with the new
// totals to its timeline, in one transaction under the task's row lock.
func (s *Server) record(ctx context.Context, taskID string, u Usage) {
	cost := s.prices.Cost(u)
	var totals task.Usage
	err := s.tasks.InTx(ctx, func(tx *task.Tx) error {
		t, err := tx.Lock(ctx, taskID)
		if err != nil {
			return err
		}
		totals = task.Usage{CostUSD: t.Usage.CostUSD + cost, TokensIn: t.Usage.TokensIn + u.TokensIn(), TokensOut: t.Usage.TokensOut + u.Output}
		if _, _, err := tx.Advance(ctx, taskID, "", task.Advance{Usage: &totals}); err != nil {
			return err
		}
		return tx.Append(ctx, taskID, &taskrunnerv1.Event{Payload: &taskrunnerv1.Event_Usage{Usage: &taskrunnerv1.Usage{
			CostUsd: totals.CostUSD, TokensIn: totals.TokensIn, TokensOut: totals.TokensOut}}})
	})
	if err != nil {
		s.log.WarnContext(ctx, "modelproxy: usage not recorded", "task_id", taskID, "model", u.Model, "tokens_in", u.TokensIn(),
			"tokens_out", u.Output, "cost_usd", cost, "error", err)
		return
	}
	s.log.DebugContext(ctx, "modelproxy: usage", "task_id", taskID, "model", u.Model, "tokens_in", u.TokensIn(), "tokens_out", u.Output,
		"cost_usd", cost, "total_cost_usd", totals.CostUSD)
}

// refuse answers in the upstream API's error shape, so the CLI shows the message;
// x-should-retry: false keeps the SDKs from retrying a refusal.
func (s *Server) refuse(w http.ResponseWriter, api API, status int, why, typ, msg string) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("X-Should-Retry", "false")
	if why != "" {
		h.Set(RefusalHeader, why)
	}
	w.WriteHeader(status)
	var body any
	if api == Anthropic {
		body = map[string]any{"type": "error", "error": map[string]any{"type": typ, "message": msg}}
	} else {
		body = map[string]any{"error": map[string]any{"type": typ, "code": typ, "message": msg, "param": nil}}
	}
	_ = json.NewEncoder(w).Encode(body)
}

// budgetErrorType is the API's own error type for a spent budget.
func budgetErrorType(api API) string {
	if api == Anthropic {
		return "billing_error"
	}
	return "insufficient_quota"
}
