package rest_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
)

// violation returns the field of the first BadRequest field violation and
// the reason of the ErrorInfo in an error body.
func details(t *testing.T, body map[string]any) (field, reason string) {
	t.Helper()
	for _, d := range body["details"].([]any) {
		d := d.(map[string]any)
		switch d["@type"] {
		case "type.googleapis.com/google.rpc.BadRequest":
			field = d["field_violations"].([]any)[0].(map[string]any)["field"].(string)
		case "type.googleapis.com/google.rpc.ErrorInfo":
			reason = d["reason"].(string)
		}
	}
	return field, reason
}

// TestErrorContract checks every class of error answer: one shape,
// {code, message, details}, a message that starts with the field it is
// about and a BadRequest naming it, the right status, and no internal
// headers.
func TestErrorContract(t *testing.T) {
	e := newEnv(t)
	const id = "00000000-0000-0000-0000-000000000000"
	long := strings.Repeat("é", 100)
	cases := []struct {
		name, method, path, body string
		hdr                      []string
		status                   int
		code                     float64
		prefix                   string // the message starts with it
		field, reason            string
		allow                    string
	}{
		{name: "unknown JSON field", method: "POST", path: "/v1/tasks", body: `{"repo":"a/b","prompt":"p","foo":1}`,
			status: 400, code: 3, prefix: "foo: unknown field", field: "foo", reason: "INVALID_ARGUMENT"},
		{name: "unknown field with a long non-ASCII name", method: "POST", path: "/v1/tasks", body: `{"` + long + `":1}`,
			status: 400, code: 3, prefix: strings.Repeat("é", 30) + "…: unknown field", field: strings.Repeat("é", 30) + "…", reason: "INVALID_ARGUMENT"},
		{name: "duplicate field", method: "POST", path: "/v1/tasks", body: `{"repo":"a/b","repo":"c/d","prompt":"p"}`,
			status: 400, code: 3, prefix: "repo: duplicate field", field: "repo", reason: "INVALID_ARGUMENT"},
		{name: "malformed JSON", method: "POST", path: "/v1/tasks", body: `{"repo":`,
			status: 400, code: 3, prefix: "body: malformed JSON", field: "body", reason: "INVALID_ARGUMENT"},
		{name: "JSON syntax error inside", method: "POST", path: "/v1/tasks", body: `{"repo" "a/b"}`,
			status: 400, code: 3, prefix: "body: malformed JSON", field: "body", reason: "INVALID_ARGUMENT"},
		{name: "wrong type", method: "POST", path: "/v1/tasks", body: `{"repo":5,"prompt":"p"}`,
			status: 400, code: 3, prefix: "repo: invalid string value 5", field: "repo", reason: "INVALID_ARGUMENT"},
		{name: "wrong type, two-word field", method: "POST", path: "/v1/tasks", body: `{"repo":"a/b","prompt":"p","base_branch":true}`,
			status: 400, code: 3, prefix: "base_branch: invalid string value true", field: "base_branch", reason: "INVALID_ARGUMENT"},
		{name: "unknown enum value", method: "POST", path: "/v1/tasks", body: `{"repo":"a/b","prompt":"p","agent":"AGENT_GPT"}`,
			status: 400, code: 3, prefix: `agent: invalid enum value "AGENT_GPT"`, field: "agent", reason: "INVALID_ARGUMENT"},
		{name: "service validation", method: "POST", path: "/v1/tasks", body: `{"repo":"a/b"}`,
			status: 400, code: 3, prefix: "prompt: ", field: "prompt", reason: "INVALID_ARGUMENT"},
		{name: "query parameter not a number", method: "GET", path: "/v1/tasks?page_size=ten",
			status: 400, code: 3, prefix: `page_size: invalid value: "ten"`, field: "page_size", reason: "INVALID_ARGUMENT"},
		{name: "unknown view", method: "GET", path: "/v1/tasks/" + id + "?view=TASK_VIEW_TINY",
			status: 400, code: 3, prefix: "view: ", field: "view", reason: "INVALID_ARGUMENT"},
		{name: "query parameter over the page maximum", method: "GET", path: "/v1/tasks?page_size=101",
			status: 400, code: 3, prefix: "page_size: ", field: "page_size", reason: "INVALID_ARGUMENT"},
		{name: "body over the limit (Content-Length)", method: "POST", path: "/v1/tasks", body: `{"prompt":"` + strings.Repeat("x", 70<<10) + `"}`,
			status: 413, code: 3, prefix: "body: the request body is", field: "body", reason: "BODY_TOO_LARGE"},
		{name: "body over the limit (chunked)", method: "POST", path: "/v1/tasks", body: "chunked:" + `{"prompt":"` + strings.Repeat("x", 70<<10) + `"}`,
			status: 413, code: 3, prefix: "body: the request body exceeds the limit of 65536 bytes", field: "body", reason: "BODY_TOO_LARGE"},
		{name: "unknown custom method", method: "POST", path: "/v1/tasks/" + id + ":frobnicate", body: `{}`,
			status: 404, code: 5, prefix: "no route for POST /v1/tasks/" + id + ":frobnicate", reason: "ROUTE_NOT_FOUND"},
		{name: "unknown custom method with GET", method: "GET", path: "/v1/tasks/" + id + ":frobnicate",
			status: 404, code: 5, prefix: "no route for GET", reason: "ROUTE_NOT_FOUND"},
		{name: "internal RPC", method: "POST", path: "/v1/tasks/" + id + ":advance", body: `{}`,
			status: 404, code: 5, prefix: "no route", reason: "ROUTE_NOT_FOUND"},
		{name: "unknown path under /v1", method: "GET", path: "/v1/nothing",
			status: 404, code: 5, prefix: "no route for GET /v1/nothing", reason: "ROUTE_NOT_FOUND"},
		{name: "unknown path elsewhere", method: "GET", path: "/nothing/here",
			status: 404, code: 5, prefix: "no route for GET /nothing/here", reason: "ROUTE_NOT_FOUND"},
		{name: "wrong method on a custom method", method: "GET", path: "/v1/tasks/" + id + ":cancel",
			status: 405, code: 12, prefix: "method GET not allowed", reason: "METHOD_NOT_ALLOWED", allow: "POST"},
		{name: "wrong method on a collection", method: "DELETE", path: "/v1/tasks",
			status: 405, code: 12, prefix: "method DELETE not allowed", reason: "METHOD_NOT_ALLOWED", allow: "GET, POST"},
		{name: "wrong method on health", method: "POST", path: "/healthz",
			status: 405, code: 12, prefix: "method POST not allowed", reason: "METHOD_NOT_ALLOWED", allow: "GET"},
		{name: "no token", method: "GET", path: "/v1/tasks", hdr: []string{"Authorization", ""},
			status: 401, code: 16, prefix: ""},
		{name: "not found", method: "GET", path: "/v1/tasks/" + id,
			status: 404, code: 5, prefix: "task", reason: "NOT_FOUND"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			owner := "alice"
			if len(tc.hdr) > 0 && tc.hdr[0] == "Authorization" {
				owner = ""
			}
			r := e.doBody(t, tc.method, tc.path, owner, tc.body)
			require.Equal(t, tc.status, r.status, r.raw)
			require.Equal(t, "application/json", r.header.Get("Content-Type"))
			require.NotEmpty(t, r.header.Get("X-Request-Id"))
			for k := range r.header {
				require.False(t, strings.HasPrefix(k, "Grpc"), "internal header %s leaked", k)
			}
			require.Contains(t, r.body, "details", r.raw)
			require.Equal(t, tc.code, r.body["code"], r.raw)
			msg := r.body["message"].(string)
			require.True(t, utf8.ValidString(msg))
			require.True(t, strings.HasPrefix(msg, tc.prefix), "message %q does not start with %q", msg, tc.prefix)
			field, reason := details(t, r.body)
			require.Equal(t, tc.field, field, r.raw)
			if tc.reason != "" {
				require.Equal(t, tc.reason, reason, r.raw)
			}
			require.Equal(t, tc.allow, r.header.Get("Allow"))
			if tc.status == http.StatusUnauthorized {
				require.Equal(t, `Bearer realm="taskrunner"`, r.header.Get("WWW-Authenticate"))
			}
			require.Zero(t, e.rows(t), "a rejected request writes nothing")
		})
	}
}

// doBody is do, except that a body starting with "chunked:" is sent
// without a Content-Length, so only reading it finds it too large.
func (e *env) doBody(t *testing.T, method, path, owner, body string) reply {
	t.Helper()
	rest, chunked := strings.CutPrefix(body, "chunked:")
	if !chunked {
		return e.do(t, method, path, owner, body)
	}
	req, err := http.NewRequest(method, e.url+path, io.MultiReader(strings.NewReader(rest)))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+e.tokens[owner])
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	r := reply{status: resp.StatusCode, header: resp.Header, raw: string(b)}
	require.NoError(t, json.Unmarshal(b, &r.body), string(b))
	return r
}
