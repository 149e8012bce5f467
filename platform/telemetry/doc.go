// Package telemetry is the OpenTelemetry setup every taskrunner process
// shares: traces exported over OTLP (configured only by the standard OTEL_*
// variables), W3C trace context propagation (traceparent helpers for handing
// a trace to a sandbox and back), and a slog handler that stamps trace and
// span ids on every record.
//
// Metrics are opt-in: a process passes the reader it wants with
// WithMetricReader. The gateway uses MetricsPage, a small Prometheus text
// page over an SDK reader; taskrunnerd plugs in the Prometheus exporter from
// services/telemetry. Neither the Prometheus client nor autoexport (which
// links it) is imported here, so the sandbox's runner binary links no
// Prometheus registry. It must not read any taskrunner-specific
// configuration.
package telemetry
