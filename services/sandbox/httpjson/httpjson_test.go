package httpjson_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/taskrunner/taskrunner/services/sandbox/httpjson"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// server answers each request with the next of answers (the last repeats)
// and records what it got.
type server struct {
	mu      sync.Mutex
	answers []answer
	got     []*http.Request
	bodies  []string
}

type answer struct {
	status     int
	body       string
	retryAfter string
}

func newServer(t *testing.T, answers ...answer) (*server, *httpjson.Client) {
	s := &server{answers: answers}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		defer s.mu.Unlock()
		var b json.RawMessage
		_ = json.NewDecoder(r.Body).Decode(&b)
		s.got = append(s.got, r)
		s.bodies = append(s.bodies, string(b))
		a := s.answers[min(len(s.got), len(s.answers))-1]
		if a.retryAfter != "" {
			w.Header().Set("Retry-After", a.retryAfter)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(a.status)
		_, _ = w.Write([]byte(a.body))
	}))
	t.Cleanup(srv.Close)
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	c := &httpjson.Client{Base: srv.URL, HTTP: &http.Client{Transport: tr}, BearerToken: "k",
		BackOff: func() backoff.BackOff { return backoff.NewConstantBackOff(10 * time.Millisecond) },
		ErrorMessage: func(body []byte) (string, string) {
			var env struct {
				Error struct{ Type, Message string } `json:"error"`
			}
			_ = json.Unmarshal(body, &env)
			return env.Error.Type, env.Error.Message
		}}
	return s, c
}

func TestRequestAndAnswer(t *testing.T) {
	s, c := newServer(t, answer{status: 201, body: `{"box_id":"b1"}`})
	var out struct {
		ID string `json:"box_id"`
	}
	require.NoError(t, c.Do(t.Context(), http.MethodPost, "/v1/boxes", url.Values{"x": {"1 2"}}, map[string]string{"name": "n"}, &out))
	require.Equal(t, "b1", out.ID)
	r := s.got[0]
	require.Equal(t, "/v1/boxes", r.URL.Path)
	require.Equal(t, "x=1+2", r.URL.RawQuery)
	require.Equal(t, "Bearer k", r.Header.Get("Authorization"))
	require.Equal(t, "application/json", r.Header.Get("Content-Type"))
	require.Equal(t, "application/json", r.Header.Get("Accept"))
	require.JSONEq(t, `{"name":"n"}`, s.bodies[0])
}

func TestRetries(t *testing.T) {
	tests := []struct {
		name      string
		method    string
		answers   []answer
		wantCalls int
		wantErr   int // status of the final error; 0: success
		minWait   time.Duration
	}{
		{"503 on GET is retried", http.MethodGet, []answer{{status: 503}, {status: 502}, {status: 200, body: `{}`}}, 3, 0, 0},
		{"503 on POST is not", http.MethodPost, []answer{{status: 503}, {status: 201}}, 1, 503, 0},
		{"429 on POST waits Retry-After", http.MethodPost, []answer{{status: 429, retryAfter: "1"}, {status: 201, body: `{}`}}, 2, 0, time.Second},
		{"404 is final", http.MethodDelete, []answer{{status: 404, body: `{"error":{"message":"no such box","type":"NotFoundError"}}`}}, 1, 404, 0},
		{"tries are bounded", http.MethodGet, []answer{{status: 503}}, 4, 503, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, c := newServer(t, tt.answers...)
			start := time.Now()
			err := c.Do(t.Context(), tt.method, "/x", nil, nil, nil)
			require.Len(t, s.got, tt.wantCalls)
			require.GreaterOrEqual(t, time.Since(start), tt.minWait)
			if tt.wantErr == 0 {
				require.NoError(t, err)
				return
			}
			require.True(t, httpjson.IsStatus(err, tt.wantErr), "%v", err)
		})
	}
}

func TestErrorEnvelope(t *testing.T) {
	_, c := newServer(t, answer{status: 409, body: `{"error":{"message":"box is running","type":"InvalidStateError","code":"invalid_state"}}`})
	err := c.Do(t.Context(), http.MethodDelete, "/v1/boxes/b1", nil, nil, nil)
	var e *httpjson.Error
	require.ErrorAs(t, err, &e)
	require.Equal(t, 409, e.Status)
	require.Equal(t, "InvalidStateError", e.Type)
	require.Equal(t, "box is running", e.Message)
	require.EqualError(t, err, "DELETE /v1/boxes/b1: HTTP 409 InvalidStateError: box is running")

	_, c = newServer(t, answer{status: 500, body: "upstream broke\n"})
	err = c.Do(t.Context(), http.MethodPost, "/v1/boxes", nil, nil, nil)
	require.EqualError(t, err, "POST /v1/boxes: HTTP 500: upstream broke")
}
