package rest_test

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"

	"github.com/taskrunner/taskrunner/gateway/rest"
)

func withCORS(origins ...string) func(*rest.Options, *grpc.ClientConn) {
	return func(o *rest.Options, _ *grpc.ClientConn) { o.CORS = rest.CORS{Origins: origins, MaxAge: 600e9} }
}

const page = "http://app.example:3000"

func TestCORSOffByDefault(t *testing.T) {
	e := newEnv(t)
	r := e.do(t, "OPTIONS", "/v1/tasks", "", "", "Origin", page, "Access-Control-Request-Method", "POST")
	require.Empty(t, r.header.Get("Access-Control-Allow-Origin"))
	require.Equal(t, http.StatusMethodNotAllowed, r.status, r.raw)
	r = e.do(t, "GET", "/v1/tasks", "alice", "", "Origin", page)
	require.Equal(t, http.StatusOK, r.status)
	require.Empty(t, r.header.Get("Access-Control-Allow-Origin"))
}

func TestCORS(t *testing.T) {
	e := newEnv(t, withEverything(t), withCORS(page, "https://other.example"))
	const sse = "/v1/tasks/00000000-0000-0000-0000-000000000000/events"
	for _, path := range []string{"/v1/tasks", "/v1/tasks/00000000-0000-0000-0000-000000000000:cancel", sse} {
		r := e.do(t, "OPTIONS", path, "", "", "Origin", page, "Access-Control-Request-Method", "POST",
			"Access-Control-Request-Headers", "authorization,content-type,idempotency-key")
		require.Equal(t, http.StatusNoContent, r.status, r.raw)
		require.Equal(t, page, r.header.Get("Access-Control-Allow-Origin"))
		require.Equal(t, "GET, HEAD, POST", r.header.Get("Access-Control-Allow-Methods"))
		require.Equal(t, "Authorization, Content-Type, Idempotency-Key, Last-Event-ID, X-Request-Id", r.header.Get("Access-Control-Allow-Headers"))
		require.Equal(t, "600", r.header.Get("Access-Control-Max-Age"))
		require.Contains(t, r.header.Values("Vary"), "Origin")
		require.Empty(t, r.header.Get("Access-Control-Allow-Credentials"), "bearer tokens, never cookies")
	}
	// Another origin's preflight is refused in the API's shape, without CORS headers.
	r := e.do(t, "OPTIONS", "/v1/tasks", "", "", "Origin", "http://evil.example", "Access-Control-Request-Method", "POST")
	require.Equal(t, http.StatusForbidden, r.status, r.raw)
	require.Empty(t, r.header.Get("Access-Control-Allow-Origin"))
	require.EqualValues(t, 7, r.body["code"])
	r = e.do(t, "OPTIONS", "/v1/tasks", "", "", "Origin", page, "Access-Control-Request-Method", "DELETE")
	require.Equal(t, http.StatusForbidden, r.status, r.raw)

	// Actual requests: success, API error and SSE error all carry the headers.
	r = e.do(t, "POST", "/v1/tasks", "alice", `{"repo":"a/b","prompt":"p"}`, "Origin", page, "Content-Type", "application/json")
	require.Equal(t, http.StatusOK, r.status, r.raw)
	require.Equal(t, page, r.header.Get("Access-Control-Allow-Origin"))
	require.Equal(t, "X-Request-Id, Retry-After, WWW-Authenticate, Allow", r.header.Get("Access-Control-Expose-Headers"))
	r = e.do(t, "GET", "/v1/tasks", "", "", "Origin", "https://other.example")
	require.Equal(t, http.StatusUnauthorized, r.status)
	require.Equal(t, "https://other.example", r.header.Get("Access-Control-Allow-Origin"))
	r = e.do(t, "GET", sse, "", "", "Origin", page)
	require.Equal(t, http.StatusUnauthorized, r.status, r.raw)
	require.Equal(t, page, r.header.Get("Access-Control-Allow-Origin"))
	// Not an allowed origin: served, but without CORS headers (the browser withholds the answer).
	r = e.do(t, "GET", "/v1/tasks", "alice", "", "Origin", "http://evil.example")
	require.Equal(t, http.StatusOK, r.status)
	require.Empty(t, r.header.Get("Access-Control-Allow-Origin"))
	require.Contains(t, r.header.Values("Vary"), "Origin")
}

func TestCORSAnyOrigin(t *testing.T) {
	e := newEnv(t, withCORS("*"))
	r := e.do(t, "OPTIONS", "/v1/tasks", "", "", "Origin", "http://anything.example", "Access-Control-Request-Method", "GET")
	require.Equal(t, http.StatusNoContent, r.status)
	require.Equal(t, "*", r.header.Get("Access-Control-Allow-Origin"))
}

func TestCORSValidate(t *testing.T) {
	for _, bad := range []string{"app.example", "ftp://app.example", "http://app.example/path", "http://user@app.example", "http://"} {
		require.Error(t, rest.CORS{Origins: []string{bad}}.Validate(), bad)
	}
	require.NoError(t, rest.CORS{Origins: []string{"*", "https://app.example", "http://127.0.0.1:5173"}}.Validate())
}
