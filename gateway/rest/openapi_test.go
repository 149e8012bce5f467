package rest_test

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"os"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"

	"github.com/taskrunner/taskrunner/gateway/console"
	"github.com/taskrunner/taskrunner/gateway/rest"
	"github.com/taskrunner/taskrunner/gateway/sse"
	"github.com/taskrunner/taskrunner/gateway/webhook"
	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
	"github.com/taskrunner/taskrunner/services/events"
	"github.com/taskrunner/taskrunner/services/store/storetest"
)

// publicRoutes is the public HTTP surface of the gateway. A route that
// disappears from the mux or from the document fails TestOpenAPICoversEveryRoute.
var publicRoutes = []string{
	"POST /v1/tasks", "GET /v1/tasks", "GET /v1/tasks/{id}",
	"POST /v1/tasks/{id}:dispatch", "POST /v1/tasks/{id}:cancel", "POST /v1/tasks/{id}:retry",
	"GET /v1/tasks/{task_id}/events:list",
	"GET /v1/tasks/{id}/events",
	"GET /v1/projects/{repo}/branches/{branch}/tasks/{id}/events",
	"GET /v1/projects/{owner}/{name}/branches/{branch}/tasks/{id}/events",
	"POST /v1/webhooks/github",
	"GET /healthz", "GET /readyz", "GET /openapi.json", "GET /metrics",
	"GET /", "GET /console/{asset}",
}

// restServices are the gRPC services whose HTTP rules rest registers.
var restServices = []string{"TaskService", "EventsService", "TokenService"}

type operation struct {
	OperationID string           `json:"operationId"`
	MuxPattern  string           `json:"x-mux-pattern"`
	Produces    []string         `json:"produces"`
	Parameters  []map[string]any `json:"parameters"`
	Security    *[]any           `json:"security"`
	Responses   map[string]struct {
		Schema   map[string]any `json:"schema"`
		Examples map[string]any `json:"examples"`
	} `json:"responses"`
}

type swagger struct {
	Swagger             string                          `json:"swagger"`
	Paths               map[string]map[string]operation `json:"paths"`
	Definitions         map[string]map[string]any       `json:"definitions"`
	SecurityDefinitions map[string]map[string]any       `json:"securityDefinitions"`
	Security            []map[string]any                `json:"security"`
	Tags                []map[string]any                `json:"tags"`
}

func (s swagger) ops() map[string]operation {
	out := map[string]operation{}
	for p, item := range s.Paths {
		for m, op := range item {
			out[strings.ToUpper(m)+" "+p] = op
		}
	}
	return out
}

// withEverything mounts what cmd/gateway mounts, built from the real
// packages: SSE (on the test's Redis), the console, the webhook, metrics.
func withEverything(t *testing.T) func(*rest.Options, *grpc.ClientConn) {
	return func(o *rest.Options, conn *grpc.ClientConn) {
		lg := slog.New(slog.DiscardHandler)
		rds := storetest.NewRedis(t)
		stream, err := sse.New(sse.Config{RedisPrefix: rds.Prefix}, taskrunnerv1.NewTaskServiceClient(conn),
			taskrunnerv1.NewEventsServiceClient(conn), rds.Client, lg)
		require.NoError(t, err)
		t.Cleanup(stream.Close)
		cons, err := console.New(console.Config{}, taskrunnerv1.NewTaskServiceClient(conn))
		require.NoError(t, err)
		wh, err := webhook.New(webhook.Config{Secret: "s3cret-for-the-rest-tests"}, taskrunnerv1.NewTaskServiceClient(conn), lg)
		require.NoError(t, err)
		o.Extra = stream.Routes()
		for p, h := range cons.Routes() {
			o.Extra[p] = h
		}
		o.Unlimited = map[string]http.Handler{
			"POST " + webhook.Path: wh,
			"GET /metrics": http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				_, _ = io.WriteString(w, "# no metrics in this test\n")
			}),
		}
	}
}

// httpRules reads the public routes of the registered services from the
// HTTP rule file grpc-gateway is generated from.
func httpRules(t *testing.T) []string {
	b, err := os.ReadFile("../../proto/taskrunner/v1/taskrunner_http.yaml")
	require.NoError(t, err)
	re := regexp.MustCompile(`selector:\s*taskrunner\.v1\.(\w+)\.\w+\s*\n\s*(get|post|put|patch|delete):\s*(\S+)`)
	var out []string
	for _, m := range re.FindAllStringSubmatch(string(b), -1) {
		if !slices.Contains(restServices, m[1]) {
			t.Logf("HTTP rule %s %s of %s: not registered in rest", m[2], m[3], m[1])
			continue
		}
		out = append(out, strings.ToUpper(m[2])+" "+m[3])
	}
	require.NotEmpty(t, out)
	return out
}

// coverage lists what the document lacks: a public route, a pattern the
// mux serves, or a route of the HTTP rules.
func coverage(doc swagger, patterns, rules []string) []string {
	ops := doc.ops()
	documented := map[string]bool{}
	for _, op := range ops {
		documented[op.MuxPattern] = true
	}
	var problems []string
	for _, r := range append(slices.Clone(publicRoutes), rules...) {
		if _, ok := ops[r]; !ok {
			problems = append(problems, "not in the document: "+r)
		}
	}
	for _, p := range patterns {
		if !documented[p] {
			problems = append(problems, "served but not documented: "+p)
		}
	}
	sort.Strings(problems)
	return problems
}

func served(t *testing.T, e *env) swagger {
	t.Helper()
	r := e.do(t, "GET", "/openapi.json", "", "")
	require.Equal(t, http.StatusOK, r.status)
	require.Equal(t, string(e.server.OpenAPI()), r.raw)
	var doc swagger
	require.NoError(t, json.Unmarshal([]byte(r.raw), &doc))
	return doc
}

// TestOpenAPICoversEveryRoute: every public route, every pattern the mux
// serves and every HTTP rule is in the document, and every operation of
// the document is served (a request reaches a handler instead of the
// 404/405 of routing).
func TestOpenAPICoversEveryRoute(t *testing.T) {
	e := newEnv(t, withEverything(t))
	doc := served(t, e)
	require.Empty(t, coverage(doc, e.server.Patterns(), httpRules(t)))

	fill := strings.NewReplacer("{id}", "00000000-0000-0000-0000-000000000000", "{task_id}", "00000000-0000-0000-0000-000000000000",
		"{repo}", "acme%2Fwidgets", "{owner}", "acme", "{name}", "widgets", "{branch}", "main", "{asset}", "app.js")
	for key := range doc.ops() {
		method, path, _ := strings.Cut(key, " ")
		t.Run(key, func(t *testing.T) {
			body := ""
			if method == "POST" {
				body = "{}"
			}
			r := e.do(t, method, fill.Replace(path), "", body)
			require.NotEqual(t, http.StatusMethodNotAllowed, r.status, r.raw)
			if r.status == http.StatusNotFound {
				_, reason := details(t, r.body)
				require.NotEqual(t, "ROUTE_NOT_FOUND", reason, "%s is documented but not served", key)
			}
			if r.status >= 400 {
				require.Contains(t, r.body, "code", "error answers have the API's shape: %s", r.raw)
				require.Contains(t, r.body, "details", r.raw)
			}
		})
	}
}

// TestOpenAPICoverageFailsOnARemovedRoute: without the SSE routes the
// same check reports them.
func TestOpenAPICoverageFailsOnARemovedRoute(t *testing.T) {
	e := newEnv(t, withEverything(t), func(o *rest.Options, _ *grpc.ClientConn) {
		delete(o.Extra, sse.PathPattern)
		delete(o.Unlimited, "POST "+webhook.Path)
	})
	require.Equal(t, []string{"not in the document: GET /v1/tasks/{id}/events", "not in the document: POST /v1/webhooks/github"},
		coverage(served(t, e), e.server.Patterns(), httpRules(t)))
	r := e.do(t, "GET", "/v1/tasks/00000000-0000-0000-0000-000000000000/events", "alice", "")
	require.Equal(t, http.StatusNotFound, r.status, r.raw)
	// A pattern served without a description is reported too.
	require.Contains(t, coverage(served(t, e), append(e.server.Patterns(), "GET /v1/undocumented"), nil),
		"served but not documented: GET /v1/undocumented")
}

// TestOpenAPIContents checks what the issue asks of the document.
func TestOpenAPIContents(t *testing.T) {
	e := newEnv(t, withEverything(t))
	doc := served(t, e)
	require.Equal(t, "2.0", doc.Swagger)
	require.Equal(t, map[string]any{"type": "apiKey", "in": "header", "name": "Authorization",
		"description": doc.SecurityDefinitions["bearer"]["description"]}, doc.SecurityDefinitions["bearer"])
	require.Equal(t, []map[string]any{{"bearer": []any{}}}, doc.Security)
	require.Equal(t, []any{"code", "message", "details"}, doc.Definitions["rpcStatus"]["required"])
	require.ElementsMatch(t, []any{"repo", "prompt"}, doc.Definitions["v1CreateTaskRequest"]["required"])
	require.Contains(t, doc.Definitions["v1Task"]["required"], "status")

	ops := doc.ops()
	create := ops["POST /v1/tasks"]
	require.True(t, slices.ContainsFunc(create.Parameters, func(p map[string]any) bool {
		return p["in"] == "header" && p["name"] == "Idempotency-Key"
	}), "Idempotency-Key header on create")
	require.NotEmpty(t, create.Responses["200"].Examples["application/json"])
	for key, op := range ops {
		for code, resp := range op.Responses {
			if code == "default" || code >= "400" {
				require.Equal(t, "#/definitions/rpcStatus", resp.Schema["$ref"], "%s answers %s with the error schema", key, code)
			}
		}
	}
	for _, key := range []string{"GET /v1/tasks/{id}/events", "GET /v1/projects/{repo}/branches/{branch}/tasks/{id}/events"} {
		op := ops[key]
		require.Contains(t, op.Produces, "text/event-stream", key)
		require.Contains(t, op.Responses, "204", key)
		require.True(t, slices.ContainsFunc(op.Parameters, func(p map[string]any) bool {
			return p["in"] == "header" && p["name"] == "Last-Event-ID"
		}), key)
		var full struct {
			Paths map[string]map[string]struct {
				Responses map[string]map[string]any `json:"responses"`
			} `json:"paths"`
		}
		require.NoError(t, json.Unmarshal(e.server.OpenAPI(), &full))
		_, p, _ := strings.Cut(key, " ")
		evs := full.Paths[p]["get"].Responses["200"]["x-sse-events"].(map[string]any)
		for _, name := range []string{"stage_change", "log", "diff_stats", "usage", "completed", "failed", "cancelled",
			"status_change", "queue_position", "sandbox"} {
			require.Contains(t, evs, name, key)
		}
	}
	for _, key := range []string{"GET /healthz", "GET /readyz", "POST /v1/webhooks/github"} {
		require.NotNil(t, ops[key].Security, key)
		require.Empty(t, *ops[key].Security, "%s needs no bearer token", key)
	}
	// Internal services stay out, with their tags and messages.
	for key, op := range ops {
		for _, internal := range []string{"TaskService_AdvanceTask", "DispatchService_", "GitHubTokenService_", "EventsService_Connect", "EventsService_Subscribe"} {
			require.False(t, strings.HasPrefix(op.OperationID, internal), key)
		}
	}
	for _, tag := range doc.Tags {
		require.NotContains(t, []string{"DispatchService", "GitHubTokenService"}, tag["name"])
	}
	for _, def := range []string{"v1AdvanceTaskRequest", "v1DispatchRequest", "v1ConnectRequest"} {
		require.NotContains(t, doc.Definitions, def)
	}
}

// TestOpenAPIPageMaxima: the documented page maxima are the services'.
func TestOpenAPIPageMaxima(t *testing.T) {
	e := newEnv(t)
	ops := served(t, e).ops()
	limit := func(key string) float64 {
		for _, p := range ops[key].Parameters {
			if p["name"] == "page_size" {
				require.EqualValues(t, 1, p["minimum"])
				return p["maximum"].(float64)
			}
		}
		t.Fatalf("%s has no page_size", key)
		return 0
	}
	require.EqualValues(t, events.MaxPageSize, limit("GET /v1/tasks/{task_id}/events:list"))
	max := int(limit("GET /v1/tasks"))
	r := e.do(t, "GET", "/v1/tasks?page_size="+strconv.Itoa(max), "alice", "")
	require.Equal(t, http.StatusOK, r.status, r.raw)
	r = e.do(t, "GET", "/v1/tasks?page_size="+strconv.Itoa(max+1), "alice", "")
	require.Equal(t, http.StatusBadRequest, r.status, r.raw)
}
