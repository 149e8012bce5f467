package task

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/taskrunner/taskrunner/platform/telemetry"
)

// StartSpan starts a span in t's own trace, as a child of its task.create
// span (even when the call arrives in another request: dispatch, cancel,
// the webhook's merge), linked to the caller's span. The returned context
// keeps ctx's cancellation and deadline, with the new span. A task without
// a recorded traceparent gets an ordinary child of ctx.
func StartSpan(ctx context.Context, t Task, name string) (context.Context, trace.Span) {
	attrs := trace.WithAttributes(attribute.String("taskrunner.task_id", t.ID))
	if t.Traceparent == "" {
		return tracer.Start(ctx, name, attrs)
	}
	opts := []trace.SpanStartOption{attrs}
	if caller := trace.SpanContextFromContext(ctx); caller.IsValid() {
		opts = append(opts, trace.WithLinks(trace.Link{SpanContext: caller}))
	}
	parent := telemetry.ContextFromTraceparent(context.WithoutCancel(ctx), t.Traceparent)
	_, span := tracer.Start(parent, name, opts...)
	return trace.ContextWithSpan(ctx, span), span
}
