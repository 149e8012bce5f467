package telemetry

import (
	"context"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
)

func TestMetricsPage(t *testing.T) {
	page := NewMetricsPage()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(page.Reader()))
	defer mp.Shutdown(context.Background())
	m := mp.Meter("test")
	g, _ := m.Int64ObservableGauge("taskrunner.sse.subscribers", metric.WithDescription("Open SSE streams"))
	q, _ := m.Int64ObservableGauge("taskrunner.sse.queued_bytes", metric.WithUnit("By"))
	c, _ := m.Int64Counter("taskrunner.sse.cut_off")
	h, _ := m.Float64Histogram("http.server.request.duration", metric.WithUnit("s"), metric.WithExplicitBucketBoundaries(0.1, 1))
	_, _ = m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		o.ObserveInt64(g, 3)
		o.ObserveInt64(q, 10)
		return nil
	}, g, q)
	ctx := context.Background()
	c.Add(ctx, 2)
	h.Record(ctx, 0.5, metric.WithAttributes(attribute.String("http.route", "/v1/tasks")))
	h.Record(ctx, 2)
	got, err := page.text(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"# HELP taskrunner_sse_subscribers Open SSE streams\n# TYPE taskrunner_sse_subscribers gauge\ntaskrunner_sse_subscribers 3\n",
		"taskrunner_sse_queued_bytes 10\n",
		"# TYPE taskrunner_sse_cut_off_total counter\ntaskrunner_sse_cut_off_total 2\n",
		`http_server_request_duration_seconds_bucket{http_route="/v1/tasks",le="1"} 1`,
		`http_server_request_duration_seconds_bucket{le="+Inf"} 1`,
		"http_server_request_duration_seconds_sum 2\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("page lacks %q:\n%s", want, got)
		}
	}
}
