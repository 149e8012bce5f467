package modelapi

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"unicode/utf8"
)

// Request is the record of one HTTP request the server received.
type Request struct {
	Method string
	Path   string // path with query, e.g. /v1/messages?beta=true
	// Stage is the name of the matched stage, empty when none matched or the
	// path is not /v1/messages or /v1/responses.
	Stage string
	// Turn is the index of the scripted turn answered; -1 when there is none.
	Turn   int
	Status int
	Stream bool
	// Prompt is the start of the stage prompt the request was matched on.
	Prompt string
	// History is set on the first request of a stage with a `history` requirement: whether
	// the earlier conversation it requires was in the request.
	History HistoryCheck
	// InputTokens and OutputTokens are the usage the answer reported (0 for no answer).
	InputTokens, OutputTokens int64
}

// HistoryCheck is the outcome of a stage's `history` requirement.
type HistoryCheck int

// Outcomes of a history check.
const (
	HistoryNotChecked HistoryCheck = iota
	HistoryFound
	HistoryMissing
)

// RequestsPath answers GET with every request received so far (JSON, in
// order): tests compare the usage the answers reported with what the
// control plane recorded.
const RequestsPath = "/_modelapi/requests"

// Server answers Anthropic Messages API and OpenAI Responses API requests from a Script. It is an
// http.Handler and safe for concurrent use.
type Server struct {
	script *Script
	log    *slog.Logger
	seq    atomic.Int64 // makes message and tool_use ids unique across requests

	mu       sync.Mutex
	requests []Request
}

// New returns a server answering from script, logging every request to log.
func New(script *Script, log *slog.Logger) *Server {
	return &Server{script: script, log: log}
}

// Requests returns a copy of every request received so far, in order.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.requests...)
}

func (s *Server) record(r Request) {
	s.mu.Lock()
	s.requests = append(s.requests, r)
	s.mu.Unlock()
	s.log.Info("modelapi request", "method", r.Method, "path", r.Path, "stage", r.Stage,
		"turn", r.Turn, "status", r.Status, "stream", r.Stream, "prompt", r.Prompt)
}

// ServeHTTP routes POST /v1/messages, /v1/messages/count_tokens and /v1/responses; anything else is
// logged and answered with an empty JSON object so a start-up probe cannot fail the CLI.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rec := Request{Method: r.Method, Path: r.URL.RequestURI(), Turn: -1}
	defer func() { s.record(rec) }()
	w.Header().Set("request-id", fmt.Sprintf("req_modelapi_%d", s.seq.Add(1)))
	switch {
	case r.Method == http.MethodPost && r.URL.Path == "/v1/messages":
		rec.Status = s.messages(w, r, &rec)
	case r.Method == http.MethodPost && r.URL.Path == "/v1/responses":
		rec.Status = s.responses(w, r, &rec)
	case r.Method == http.MethodGet && r.URL.Path == RequestsPath:
		// Test-facing, like the forge's /_forge/: what was asked and answered.
		rec.Status = writeJSON(w, http.StatusOK, s.Requests())
	case r.Method == http.MethodPost && r.URL.Path == "/v1/messages/count_tokens":
		body, _ := io.ReadAll(r.Body)
		rec.Status = writeJSON(w, http.StatusOK, map[string]any{"input_tokens": len(body)/4 + 1})
	default:
		rec.Status = writeJSON(w, http.StatusOK, map[string]any{})
	}
}

func (s *Server) messages(w http.ResponseWriter, r *http.Request, rec *Request) int {
	var req apiRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		return writeJSON(w, http.StatusBadRequest, errorBody("invalid_request_error", "modelapi: bad request body: "+err.Error()))
	}
	rec.Stream = req.Stream
	p := readPrompt(&req)
	rec.Prompt = clip(firstLine(p.Text), 200)

	stage, vars := s.script.match(p)
	if stage == nil {
		return writeJSON(w, http.StatusBadRequest, errorBody("invalid_request_error",
			"modelapi: no scripted answer for: "+clip(p.LastUserText, 200)))
	}
	rec.Stage = stage.Name
	if p.Turn >= len(stage.Turns) {
		return writeJSON(w, http.StatusBadRequest, errorBody("invalid_request_error", fmt.Sprintf(
			"modelapi: no scripted answer for: %s [stage %q has %d turns, turn %d requested]",
			clip(p.LastUserText, 200), stage.Name, len(stage.Turns), p.Turn)))
	}
	rec.Turn = p.Turn
	if msg, ok := s.checkHistory(stage, p, rec); !ok {
		w.Header().Set("x-should-retry", "false")
		return writeJSON(w, http.StatusBadRequest, errorBody("invalid_request_error", msg))
	}
	turn := stage.Turns[p.Turn]

	if e := turn.Error; e != nil {
		typ := e.Type
		if typ == "" {
			typ = defaultErrorType(e.Status)
		}
		if e.NoRetry {
			w.Header().Set("x-should-retry", "false")
		}
		return writeJSON(w, e.Status, errorBody(typ, e.Message))
	}

	content, err := turn.render(vars)
	if err != nil {
		return writeJSON(w, http.StatusBadRequest, errorBody("invalid_request_error",
			fmt.Sprintf("modelapi: stage %q turn %d: %v", stage.Name, p.Turn, err)))
	}
	n := s.seq.Add(1)
	for i := range content {
		if content[i].Type == "tool_use" {
			content[i].ID = fmt.Sprintf("toolu_modelapi_%d_%d", n, i)
		}
	}
	usage := defaultUsage
	if stage.Usage != nil {
		usage = *stage.Usage
	}
	rec.InputTokens, rec.OutputTokens = int64(usage.InputTokens), int64(usage.OutputTokens)
	stop := stopReason(content)
	msg := message{
		ID:         fmt.Sprintf("msg_modelapi_%d", n),
		Type:       "message",
		Role:       "assistant",
		Model:      req.Model,
		Content:    content,
		StopReason: &stop,
		Usage:      apiUsage{InputTokens: usage.InputTokens, OutputTokens: usage.OutputTokens},
	}
	if !req.Stream {
		return writeJSON(w, http.StatusOK, msg)
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	flush := func() {}
	if f, ok := w.(http.Flusher); ok {
		flush = f.Flush
	}
	if err := writeSSE(w, flush, msg); err != nil {
		s.log.Warn("modelapi stream write failed", "err", err)
	}
	return http.StatusOK
}

// checkHistory enforces a stage's `history` requirement on its first request: the earlier
// conversation must be in the request (a resumed session), else the answer is an error that
// fails the agent's stage. Later turns of the stage are not checked: the CLI resends what the
// first one had.
func (s *Server) checkHistory(st *Stage, p Prompt, rec *Request) (string, bool) {
	if st.history == nil || p.Turn != 0 {
		return "", true
	}
	if st.history.MatchString(p.History) {
		rec.History = HistoryFound
		return "", true
	}
	rec.History = HistoryMissing
	s.log.Warn("modelapi: the earlier conversation is missing", "stage", st.Name, "history", st.History)
	return fmt.Sprintf("modelapi: stage %q must continue the earlier conversation, but the request does not carry it "+
		"(no match for %q in the %d bytes before the prompt): the session was not resumed", st.Name, st.History, len(p.History)), false
}

func writeJSON(w http.ResponseWriter, status int, v any) int {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
	return status
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}

// clip returns at most n bytes of s, cut on a rune boundary.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
