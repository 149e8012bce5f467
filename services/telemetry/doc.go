// Package telemetry is the one OpenTelemetry setup every taskrunner binary
// calls: traces exported over OTLP (configured only by the standard OTEL_*
// variables), W3C trace context propagation, metrics on a Prometheus
// endpoint, and slog handlers that stamp trace and span ids on every record.
// It must not read any taskrunner-specific configuration.
package telemetry
