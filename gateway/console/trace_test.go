package console_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/taskrunner/taskrunner/gateway/console"
	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
)

// ownerTasks answers GetTask for the tasks of the caller whose bearer
// token is "Bearer alice" only, like the Task service's owner check.
type ownerTasks struct {
	taskrunnerv1.TaskServiceClient
	traces map[string]string // task id → trace id
	calls  int
}

func (o *ownerTasks) GetTask(ctx context.Context, in *taskrunnerv1.GetTaskRequest, _ ...grpc.CallOption) (*taskrunnerv1.GetTaskResponse, error) {
	o.calls++
	md, _ := metadata.FromOutgoingContext(ctx)
	if got := md.Get("authorization"); len(got) != 1 || got[0] != "Bearer alice" {
		return nil, status.Error(codes.NotFound, "task not found")
	}
	tr, ok := o.traces[in.GetId()]
	if !ok {
		return nil, status.Error(codes.NotFound, "task not found")
	}
	return &taskrunnerv1.GetTaskResponse{Task: &taskrunnerv1.Task{Id: in.GetId(), TraceId: tr}}, nil
}

// jaegerTraceJSON is a Jaeger v1 query API answer: a gateway root, a
// dispatch child, a runner child with two stage spans (one failed), and a
// span whose parent is not in the trace.
const jaegerTraceJSON = `{"data":[{"traceID":"abc123","spans":[
 {"traceID":"abc123","spanID":"s3","operationName":"stage.propose","references":[{"refType":"CHILD_OF","traceID":"abc123","spanID":"s2"}],
  "startTime":1000300,"duration":200,"processID":"p2","tags":[{"key":"taskrunner.stage","type":"string","value":"propose"},
  {"key":"taskrunner.cost_usd","type":"float64","value":0.25},{"key":"otel.status_code","type":"string","value":"ERROR"},
  {"key":"otel.status_description","type":"string","value":"agent exited 1"}]},
 {"traceID":"abc123","spanID":"s1","operationName":"POST /v1/tasks","references":[],"startTime":1000000,"duration":50,"processID":"p1","tags":[]},
 {"traceID":"abc123","spanID":"s2","operationName":"runner","references":[{"refType":"CHILD_OF","traceID":"abc123","spanID":"s1"}],
  "startTime":1000100,"duration":900,"processID":"p2","tags":[]},
 {"traceID":"abc123","spanID":"s4","operationName":"stage.explore","references":[{"refType":"CHILD_OF","traceID":"abc123","spanID":"s2"}],
  "startTime":1000110,"duration":150,"processID":"p2","tags":[{"key":"taskrunner.stage","type":"string","value":"explore"},
  {"key":"taskrunner.cost_usd","type":"float64","value":0.1}]},
 {"traceID":"abc123","spanID":"s5","operationName":"orphan","references":[{"refType":"CHILD_OF","traceID":"abc123","spanID":"gone"}],
  "startTime":1000020,"duration":10,"processID":"p1","tags":[{"key":"error","type":"bool","value":true}]}
],"processes":{"p1":{"serviceName":"gateway"},"p2":{"serviceName":"runner"}}}]}`

func TestTraceWaterfall(t *testing.T) {
	var jaegerPaths []string
	jaeger := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		jaegerPaths = append(jaegerPaths, r.URL.Path)
		switch r.URL.Path {
		case "/jaeger/api/traces/abc123":
			_, _ = w.Write([]byte(jaegerTraceJSON))
		case "/jaeger/api/traces/broken":
			w.WriteHeader(http.StatusInternalServerError)
		default:
			http.Error(w, `{"errors":[{"code":404,"msg":"trace not found"}]}`, http.StatusNotFound)
		}
	}))
	t.Cleanup(jaeger.Close)
	tasks := &ownerTasks{traces: map[string]string{"t1": "abc123", "t2": "", "t3": "missing", "t4": "broken"}}
	h, err := console.New(console.Config{JaegerURL: "https://jaeger.example.com", JaegerQueryURL: jaeger.URL + "/jaeger/"}, tasks)
	require.NoError(t, err)
	mux := mount(h)
	require.Contains(t, get(t, mux, http.MethodGet, console.ConfigPath).Body.String(), `"traceApi":true`)

	w := get(t, mux, http.MethodGet, "/console/api/tasks/t1/trace", "Authorization", "Bearer alice")
	require.Equal(t, http.StatusOK, w.Code, w.Body.String())
	require.Equal(t, "application/json", w.Header().Get("Content-Type"))
	var wf console.Waterfall
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &wf))
	require.Equal(t, "abc123", wf.TraceID)
	require.Equal(t, int64(1000), wf.DurationUS)
	type row struct {
		id, parent, service, name string
		depth                     int
		start, dur                int64
		err                       bool
	}
	var rows []row
	for _, s := range wf.Spans {
		rows = append(rows, row{s.SpanID, s.ParentID, s.Service, s.Name, s.Depth, s.StartUS, s.DurUS, s.Error})
	}
	require.Equal(t, []row{
		{"s1", "", "gateway", "POST /v1/tasks", 0, 0, 50, false},
		{"s2", "s1", "runner", "runner", 1, 100, 900, false},
		{"s4", "s2", "runner", "stage.explore", 2, 110, 150, false},
		{"s3", "s2", "runner", "stage.propose", 2, 300, 200, true},
		{"s5", "", "gateway", "orphan", 0, 20, 10, true},
	}, rows)
	require.Equal(t, "agent exited 1", wf.Spans[3].ErrorMessage)
	require.Equal(t, "propose", wf.Spans[3].Stage)
	require.NotNil(t, wf.Spans[3].CostUSD)
	require.InDelta(t, 0.25, *wf.Spans[3].CostUSD, 1e-9)
	require.Nil(t, wf.Spans[0].CostUSD)

	// The owner check comes first: another user's token never reaches Jaeger.
	jaegerPaths = nil
	w = get(t, mux, http.MethodGet, "/console/api/tasks/t1/trace", "Authorization", "Bearer mallory")
	require.Equal(t, http.StatusNotFound, w.Code)
	require.Empty(t, jaegerPaths)
	w = get(t, mux, http.MethodGet, "/console/api/tasks/t1/trace")
	require.Equal(t, http.StatusUnauthorized, w.Code)
	require.Contains(t, w.Header().Get("WWW-Authenticate"), "Bearer")
	require.Empty(t, jaegerPaths)

	for _, tc := range []struct {
		task   string
		status int
		msg    string
	}{
		{"t2", http.StatusNotFound, "the task has no trace"},
		{"t3", http.StatusNotFound, "trace missing is not in Jaeger (yet)"},
		{"t4", http.StatusBadGateway, "Jaeger: query API answered 500 Internal Server Error"},
		{"nope", http.StatusNotFound, "task not found"},
	} {
		w = get(t, mux, http.MethodGet, "/console/api/tasks/"+tc.task+"/trace", "Authorization", "Bearer alice")
		require.Equal(t, tc.status, w.Code, tc.task)
		var e struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		}
		require.NoError(t, json.Unmarshal(w.Body.Bytes(), &e), tc.task)
		require.Equal(t, tc.msg, e.Message, tc.task)
		require.NotZero(t, e.Code, tc.task)
	}
}

func TestTraceWithoutJaeger(t *testing.T) {
	h, err := console.New(console.Config{}, &ownerTasks{})
	require.NoError(t, err)
	mux := mount(h)
	require.Contains(t, get(t, mux, http.MethodGet, console.ConfigPath).Body.String(), `"traceApi":false`)
	w := get(t, mux, http.MethodGet, "/console/api/tasks/t1/trace", "Authorization", "Bearer alice")
	require.Equal(t, http.StatusNotImplemented, w.Code)
	require.Contains(t, w.Body.String(), "TASKRUNNER_CONSOLE_JAEGER_QUERY_URL")
}
