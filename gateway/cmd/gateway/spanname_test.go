package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// TestSpanNamesCarryNoTaskID: a request's span is named by its route, with
// the task id left out, both before routing and after.
func TestSpanNamesCarryNoTaskID(t *testing.T) {
	const id = "0b7c6a1e-3f2d-4c5b-9a8e-7d6c5b4a3f21"
	r := httptest.NewRequest(http.MethodPost, "/v1/tasks/"+id+":cancel", nil)
	require.Equal(t, "POST /v1/tasks/{id}:cancel", spanName(r))

	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/tasks/{id}/events", func(http.ResponseWriter, *http.Request) {})
	ctx, span := tp.Tracer("test").Start(context.Background(), spanName(httptest.NewRequest(http.MethodGet, "/v1/tasks/"+id+"/events", nil)))
	req := httptest.NewRequest(http.MethodGet, "/v1/tasks/"+id+"/events", nil).WithContext(trace.ContextWithSpan(ctx, span))
	namedByRoute(mux).ServeHTTP(httptest.NewRecorder(), req)
	span.End()
	require.Len(t, rec.Ended(), 1)
	require.Equal(t, "GET /v1/tasks/{id}/events", rec.Ended()[0].Name())
}
