package telemetry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.26.0"
	"go.opentelemetry.io/otel/trace"
)

// Telemetry holds the providers of one process.
type Telemetry struct {
	Tracer trace.TracerProvider
	// Meter is the SDK meter provider when a metric reader was given, a
	// no-op provider otherwise.
	Meter    metric.MeterProvider
	shutdown []func(context.Context) error
}

// Option configures Setup.
type Option func(*options)

type options struct{ readers []sdkmetric.Reader }

// WithMetricReader installs an SDK meter provider that feeds r (a Prometheus
// exporter, a MetricsPage, a periodic OTLP reader). Without one, metrics are
// a no-op.
func WithMetricReader(r sdkmetric.Reader) Option {
	return func(o *options) { o.readers = append(o.readers, r) }
}

// Exporting reports whether OTEL_* variables ask for trace export. Without
// them spans are still created (trace ids reach logs, the task row and the
// PR body) but go nowhere, so a process never retries a collector that was
// never configured.
func Exporting() bool {
	for _, k := range []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_TRACES_EXPORTER"} {
		if os.Getenv(k) != "" {
			return true
		}
	}
	return false
}

// spanExporter picks the exporter the standard variables ask for, as the
// OpenTelemetry specification (and contrib's autoexport, which would link
// the Prometheus client) does: OTEL_TRACES_EXPORTER otlp (default) or none;
// OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, else OTEL_EXPORTER_OTLP_PROTOCOL,
// grpc or http/protobuf (default). The endpoint, headers, TLS and timeout
// variables are read by the OTLP exporters themselves.
func spanExporter(ctx context.Context) (sdktrace.SpanExporter, error) {
	switch kind := os.Getenv("OTEL_TRACES_EXPORTER"); kind {
	case "", "otlp":
	case "none":
		return nil, nil
	case "console":
		return stdouttrace.New()
	default:
		return nil, fmt.Errorf("OTEL_TRACES_EXPORTER=%q: taskrunner supports otlp, console and none", kind)
	}
	proto := os.Getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
	if proto == "" {
		proto = os.Getenv("OTEL_EXPORTER_OTLP_PROTOCOL")
	}
	switch proto {
	case "", "http/protobuf":
		return otlptracehttp.New(ctx)
	case "grpc":
		return otlptracegrpc.New(ctx)
	default:
		return nil, fmt.Errorf("OTEL_EXPORTER_OTLP_PROTOCOL=%q: want grpc or http/protobuf", proto)
	}
}

// Setup installs the global tracer provider, the W3C propagator and, with
// WithMetricReader, the global meter provider. service is the default
// service.name (OTEL_SERVICE_NAME wins).
func Setup(ctx context.Context, service string, opts ...Option) (*Telemetry, error) {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(semconv.ServiceName(service)))
	if err != nil {
		return nil, err
	}
	if env, _ := resource.New(ctx, resource.WithFromEnv()); env != nil {
		if merged, err := resource.Merge(res, env); err == nil {
			res = merged
		}
	}
	t := &Telemetry{}
	topts := []sdktrace.TracerProviderOption{sdktrace.WithResource(res)}
	if Exporting() {
		exp, err := spanExporter(ctx)
		if err != nil {
			return nil, err
		}
		if exp != nil {
			topts = append(topts, sdktrace.WithBatcher(exp))
		}
	}
	tp := sdktrace.NewTracerProvider(topts...)
	t.Tracer = tp
	t.shutdown = append(t.shutdown, tp.Shutdown)
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))

	if len(o.readers) == 0 {
		t.Meter = noop.NewMeterProvider()
		return t, nil
	}
	mopts := []sdkmetric.Option{sdkmetric.WithResource(res)}
	for _, r := range o.readers {
		mopts = append(mopts, sdkmetric.WithReader(r))
	}
	mp := sdkmetric.NewMeterProvider(mopts...)
	t.Meter = mp
	t.shutdown = append(t.shutdown, mp.Shutdown)
	otel.SetMeterProvider(mp)
	return t, nil
}

// Shutdown flushes spans and stops the providers.
func (t *Telemetry) Shutdown(ctx context.Context) error {
	var errs []error
	for i := len(t.shutdown) - 1; i >= 0; i-- {
		errs = append(errs, t.shutdown[i](ctx))
	}
	return errors.Join(errs...)
}

// Handler wraps a slog handler so every record logged with a context that
// carries a span gets trace_id and span_id.
func Handler(h slog.Handler) slog.Handler { return traceHandler{h} }

type traceHandler struct{ slog.Handler }

func (h traceHandler) Handle(ctx context.Context, r slog.Record) error {
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		r.AddAttrs(slog.String("trace_id", sc.TraceID().String()), slog.String("span_id", sc.SpanID().String()))
	}
	return h.Handler.Handle(ctx, r)
}

func (h traceHandler) WithAttrs(a []slog.Attr) slog.Handler {
	return traceHandler{h.Handler.WithAttrs(a)}
}
func (h traceHandler) WithGroup(n string) slog.Handler { return traceHandler{h.Handler.WithGroup(n)} }

// Traceparent renders ctx's span context as a W3C traceparent header value
// ("" when ctx has no valid span), for handing a trace to a sandbox.
func Traceparent(ctx context.Context) string {
	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, carrier)
	return carrier["traceparent"]
}

// ContextFromTraceparent returns ctx carrying the remote span context of a
// traceparent value (ctx unchanged when the value is empty or invalid).
func ContextFromTraceparent(ctx context.Context, tp string) context.Context {
	if strings.TrimSpace(tp) == "" {
		return ctx
	}
	return propagation.TraceContext{}.Extract(ctx, propagation.MapCarrier{"traceparent": tp})
}

// ChildOnly wraps a provider so its tracers only record spans that have a
// parent: database and Redis calls show up inside request traces, while
// background polling (health checks, the reaper's queries) does not start
// thousands of one-span traces.
func ChildOnly(tp trace.TracerProvider) trace.TracerProvider { return childOnlyProvider{tp} }

type childOnlyProvider struct{ trace.TracerProvider }

func (p childOnlyProvider) Tracer(name string, opts ...trace.TracerOption) trace.Tracer {
	return childOnlyTracer{Tracer: p.TracerProvider.Tracer(name, opts...)}
}

type childOnlyTracer struct{ trace.Tracer }

func (t childOnlyTracer) Start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return ctx, trace.SpanFromContext(ctx)
	}
	return t.Tracer.Start(ctx, name, opts...)
}
