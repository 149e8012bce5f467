package telemetry

import (
	"context"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	promexporter "go.opentelemetry.io/otel/exporters/prometheus"

	"github.com/taskrunner/taskrunner/platform/telemetry"
)

// Telemetry is platform/telemetry's providers plus the Prometheus page.
type Telemetry struct {
	*telemetry.Telemetry
	// Metrics serves the Prometheus text format.
	Metrics http.Handler
}

// Setup is platform/telemetry.Setup with metrics exported to a Prometheus
// registry that also carries the Go runtime and process collectors.
func Setup(ctx context.Context, service string) (*Telemetry, error) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	pexp, err := promexporter.New(promexporter.WithRegisterer(reg))
	if err != nil {
		return nil, err
	}
	t, err := telemetry.Setup(ctx, service, telemetry.WithMetricReader(pexp))
	if err != nil {
		return nil, err
	}
	return &Telemetry{Telemetry: t, Metrics: promhttp.HandlerFor(reg, promhttp.HandlerOpts{})}, nil
}
