// Package telemetry is taskrunnerd's part of the telemetry setup: the
// Prometheus exporter (with Go runtime and process collectors) behind its
// /metrics endpoint. Everything every process shares (OTLP tracing, W3C
// propagation, traceparent helpers, the slog trace handler) is
// platform/telemetry; this package only adds the metrics that need the
// Prometheus client, so neither the runner nor the gateway links it.
package telemetry
