package console

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/taskrunner/taskrunner/gateway/httperr"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
)

// TracePattern is the console's one API route: a task's trace as a
// waterfall, read from the Jaeger query API. The route names the task, not
// the trace, so the owner check is GetTask with the caller's own token and
// nobody can read a trace id they merely guessed.
const TracePattern = "GET " + AssetsPrefix + "api/tasks/{id}/trace"

const (
	maxTraceBytes = 16 << 20
	traceTimeout  = 10 * time.Second
)

// Waterfall is what TracePattern answers: the spans of one trace, parents
// before children and siblings by start time, with times relative to the
// trace's first span.
type Waterfall struct {
	TraceID    string          `json:"trace_id"`
	DurationUS int64           `json:"duration_us"`
	Spans      []WaterfallSpan `json:"spans"`
}

// WaterfallSpan is one bar of the waterfall.
type WaterfallSpan struct {
	SpanID   string `json:"span_id"`
	ParentID string `json:"parent_id,omitempty"`
	Depth    int    `json:"depth"`
	Service  string `json:"service"`
	Name     string `json:"name"`
	StartUS  int64  `json:"start_us"`
	DurUS    int64  `json:"duration_us"`
	Error    bool   `json:"error"`
	// ErrorMessage is the span's status message or exception, if any.
	ErrorMessage string `json:"error_message,omitempty"`
	// Stage and CostUSD come from the runner's stage spans
	// (taskrunner.stage, taskrunner.cost_usd: the agent session's
	// cumulative cost at the end of the stage).
	Stage   string   `json:"stage,omitempty"`
	CostUSD *float64 `json:"cost_usd,omitempty"`
}

// jaegerTrace is the part of a Jaeger v1 query API trace we read
// (GET /api/traces/{id} answers {"data": [trace]}).
type jaegerTrace struct {
	TraceID string `json:"traceID"`
	Spans   []struct {
		SpanID        string `json:"spanID"`
		OperationName string `json:"operationName"`
		References    []struct {
			RefType string `json:"refType"`
			SpanID  string `json:"spanID"`
		} `json:"references"`
		StartTime int64 `json:"startTime"` // µs since the epoch
		Duration  int64 `json:"duration"`  // µs
		Tags      []struct {
			Key   string `json:"key"`
			Value any    `json:"value"`
		} `json:"tags"`
		Logs []struct {
			Fields []struct {
				Key   string `json:"key"`
				Value any    `json:"value"`
			} `json:"fields"`
		} `json:"logs"`
		ProcessID string `json:"processID"`
	} `json:"spans"`
	Processes map[string]struct {
		ServiceName string `json:"serviceName"`
	} `json:"processes"`
}

// waterfallOf turns a Jaeger trace into a Waterfall.
func waterfallOf(tr jaegerTrace) Waterfall {
	w := Waterfall{TraceID: tr.TraceID, Spans: []WaterfallSpan{}}
	if len(tr.Spans) == 0 {
		return w
	}
	start, end := tr.Spans[0].StartTime, int64(0)
	ids := map[string]bool{}
	for _, s := range tr.Spans {
		start = min(start, s.StartTime)
		end = max(end, s.StartTime+s.Duration)
		ids[s.SpanID] = true
	}
	w.DurationUS = end - start
	children := map[string][]WaterfallSpan{}
	for _, s := range tr.Spans {
		ws := WaterfallSpan{SpanID: s.SpanID, Name: s.OperationName, StartUS: s.StartTime - start, DurUS: s.Duration,
			Service: tr.Processes[s.ProcessID].ServiceName}
		for _, r := range s.References {
			// A parent outside this trace (or not received yet) makes a root.
			if r.RefType == "CHILD_OF" && ids[r.SpanID] {
				ws.ParentID = r.SpanID
				break
			}
		}
		for _, t := range s.Tags {
			switch t.Key {
			case "error":
				ws.Error = ws.Error || t.Value == true || t.Value == "true"
			case "otel.status_code":
				ws.Error = ws.Error || t.Value == "ERROR"
			case "otel.status_description", "error.message":
				if v, ok := t.Value.(string); ok && ws.ErrorMessage == "" {
					ws.ErrorMessage = v
				}
			case "taskrunner.stage":
				ws.Stage, _ = t.Value.(string)
			case "taskrunner.cost_usd":
				if v, ok := t.Value.(float64); ok {
					ws.CostUSD = &v
				}
			}
		}
		for _, l := range s.Logs {
			for _, f := range l.Fields {
				if v, ok := f.Value.(string); ok && f.Key == "exception.message" && ws.ErrorMessage == "" {
					ws.ErrorMessage = v
				}
			}
		}
		children[ws.ParentID] = append(children[ws.ParentID], ws)
	}
	var walk func(parent string, depth int)
	walk = func(parent string, depth int) {
		kids := children[parent]
		slices.SortStableFunc(kids, func(a, b WaterfallSpan) int {
			return cmp.Or(cmp.Compare(a.StartUS, b.StartUS), cmp.Compare(a.SpanID, b.SpanID))
		})
		for _, k := range kids {
			k.Depth = depth
			w.Spans = append(w.Spans, k)
			if depth < 64 {
				walk(k.SpanID, depth+1)
			}
		}
	}
	walk("", 0)
	return w
}

// traceAPI serves TracePattern.
type traceAPI struct {
	tasks  taskrunnerv1.TaskServiceClient
	query  string // Jaeger query API base URL, no trailing slash
	client *http.Client
}

func (a *traceAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	auth := r.Header.Get("Authorization")
	if !strings.HasPrefix(auth, "Bearer ") || strings.TrimSpace(auth[len("Bearer "):]) == "" {
		w.Header().Set("WWW-Authenticate", `Bearer realm="taskrunner"`)
		writeJSONError(w, http.StatusUnauthorized, codes.Unauthenticated, "missing bearer token")
		return
	}
	if a.tasks == nil || a.query == "" {
		writeJSONError(w, http.StatusNotImplemented, codes.Unimplemented, "no Jaeger query API is configured (TASKRUNNER_CONSOLE_JAEGER_QUERY_URL)")
		return
	}
	ctx := metadata.AppendToOutgoingContext(r.Context(), "authorization", auth)
	res, err := a.tasks.GetTask(ctx, &taskrunnerv1.GetTaskRequest{Id: r.PathValue("id")})
	if err != nil {
		st := status.Convert(err)
		writeJSONError(w, httpStatusOf(st.Code()), st.Code(), st.Message())
		return
	}
	traceID := res.GetTask().GetTraceId()
	if traceID == "" {
		writeJSONError(w, http.StatusNotFound, codes.NotFound, "the task has no trace")
		return
	}
	tr, code, err := a.fetch(r.Context(), traceID)
	if err != nil {
		msg := "Jaeger: " + err.Error()
		if code == codes.NotFound {
			msg = "trace " + traceID + " is not in Jaeger (yet)"
		}
		writeJSONError(w, httpStatusOf(code), code, msg)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_ = json.NewEncoder(w).Encode(waterfallOf(tr))
}

// fetch reads one trace from the Jaeger v1 query API.
func (a *traceAPI) fetch(ctx context.Context, traceID string) (jaegerTrace, codes.Code, error) {
	ctx, cancel := context.WithTimeout(ctx, traceTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, a.query+"/api/traces/"+url.PathEscape(traceID), nil)
	if err != nil {
		return jaegerTrace{}, codes.Internal, err
	}
	req.Header.Set("Accept", "application/json")
	resp, err := a.client.Do(req)
	if err != nil {
		return jaegerTrace{}, codes.Unavailable, errors.New("query API unreachable")
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound {
		return jaegerTrace{}, codes.NotFound, errors.New("not found")
	}
	if resp.StatusCode != http.StatusOK {
		return jaegerTrace{}, codes.Unavailable, fmt.Errorf("query API answered %s", resp.Status)
	}
	var body struct {
		Data []jaegerTrace `json:"data"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxTraceBytes)).Decode(&body); err != nil {
		return jaegerTrace{}, codes.Unavailable, errors.New("query API answered something that is not a trace")
	}
	if len(body.Data) == 0 {
		return jaegerTrace{}, codes.NotFound, errors.New("not found")
	}
	return body.Data[0], codes.OK, nil
}

func httpStatusOf(c codes.Code) int {
	switch c {
	case codes.NotFound:
		return http.StatusNotFound
	case codes.Unauthenticated:
		return http.StatusUnauthorized
	case codes.PermissionDenied:
		return http.StatusForbidden
	case codes.InvalidArgument:
		return http.StatusBadRequest
	case codes.Unimplemented:
		return http.StatusNotImplemented
	default:
		return http.StatusBadGateway
	}
}

// writeJSONError answers in the API's one error shape ({code, message,
// details}, gateway/httperr).
func writeJSONError(w http.ResponseWriter, httpStatus int, c codes.Code, msg string) {
	w.Header().Set("Cache-Control", "no-store")
	httperr.WriteHTTP(w, httpStatus, status.New(c, msg))
}
