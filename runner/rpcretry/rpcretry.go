package rpcretry

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cenkalti/backoff/v5"
	"google.golang.org/grpc"
	grpcbackoff "google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Defaults. MaxDelay bounds every wait, jitter included: an outage shorter than the task's
// deadline must cost the runner no more than about a second after the service is back.
const (
	DefaultMinDelay = 100 * time.Millisecond
	DefaultMaxDelay = time.Second
)

// jitter is backoff's RandomizationFactor: each delay is the current interval ±50 %, so that
// the runners of every task, cut off by the same restart, do not come back in lockstep.
const jitter = 0.5

// Retryable reports whether err may succeed on another attempt. Only a definite refusal is
// final: the server understood the request and said no (wrong task or certificate, a finished
// task, a protocol or argument error, an RPC it does not have). Everything else is a fault that
// ends with time: the service is down or restarting (Unavailable, connection errors), its
// database is (Internal, Aborted, Unknown), it is overloaded (ResourceExhausted) or slow
// (DeadlineExceeded), or the transport reset the stream (Internal, Canceled). Errors that carry
// no gRPC status at all (a broken connection seen by the client) are Unknown and retried.
func Retryable(err error) bool {
	if err == nil {
		return false
	}
	switch status.Code(err) {
	case codes.InvalidArgument, codes.NotFound, codes.AlreadyExists, codes.PermissionDenied,
		codes.FailedPrecondition, codes.OutOfRange, codes.Unimplemented, codes.Unauthenticated:
		return false
	}
	return true
}

// NewBackOff returns a jittered exponential backoff whose first delay is about min and whose
// delays never exceed max (backoff's MaxInterval caps the interval before jitter, so it is set
// to max/(1+jitter)). Zero values mean the defaults. Not safe for concurrent use.
func NewBackOff(min, max time.Duration) *backoff.ExponentialBackOff {
	if min <= 0 {
		min = DefaultMinDelay
	}
	if max <= 0 {
		max = DefaultMaxDelay
	}
	capped := time.Duration(float64(max) / (1 + jitter))
	if min > capped {
		min = capped
	}
	b := &backoff.ExponentialBackOff{InitialInterval: min, RandomizationFactor: jitter, Multiplier: 2, MaxInterval: capped}
	b.Reset()
	return b
}

// DialOption sets grpc-go's connection backoff to the same bounds. grpc-go reconnects a
// broken channel on its own schedule (by default up to 120 s apart); left alone, that schedule
// stacks on top of the caller's and a runner returns many seconds after the service does.
func DialOption(min, max time.Duration) grpc.DialOption {
	if min <= 0 {
		min = DefaultMinDelay
	}
	if max <= 0 {
		max = DefaultMaxDelay
	}
	const grpcJitter = 0.2 // grpc-go applies ±Jitter on top of MaxDelay
	return grpc.WithConnectParams(grpc.ConnectParams{
		Backoff: grpcbackoff.Config{
			BaseDelay: min, Multiplier: 1.6, Jitter: grpcJitter,
			MaxDelay: time.Duration(float64(max) / (1 + grpcJitter)),
		},
		// grpc-go's default: how long one connection attempt (TCP + TLS) may take.
		MinConnectTimeout: 20 * time.Second,
	})
}

// Policy configures Do.
type Policy struct {
	// MinDelay and MaxDelay bound the waits between attempts (see NewBackOff).
	MinDelay, MaxDelay time.Duration
	// AttemptTimeout bounds one attempt (0: only ctx bounds it).
	AttemptTimeout time.Duration
	// Notify, if set, sees every retried failure and the wait before the next attempt.
	Notify func(err error, next time.Duration)
}

// Do calls op until it succeeds, fails with an error Retryable refuses, or ctx ends. Each
// attempt gets its own context, bounded by AttemptTimeout. There is no limit on attempts or
// elapsed time besides ctx: the caller's context carries the task's deadline, and giving up
// earlier would fail a task that could still finish. When ctx ends, the error names both the
// cause and the last failure, so a task that timed out waiting says what it waited for.
func Do[T any](ctx context.Context, p Policy, op func(ctx context.Context) (T, error)) (T, error) {
	var last error
	attempt := func() (T, error) {
		actx, cancel := ctx, context.CancelFunc(func() {})
		if p.AttemptTimeout > 0 {
			actx, cancel = context.WithTimeout(ctx, p.AttemptTimeout)
		}
		defer cancel()
		v, err := op(actx)
		if err != nil && !Retryable(err) {
			return v, backoff.Permanent(err)
		}
		last = err
		return v, err
	}
	v, err := backoff.Retry(ctx, attempt,
		backoff.WithBackOff(NewBackOff(p.MinDelay, p.MaxDelay)),
		backoff.WithMaxElapsedTime(0), // only ctx ends the retries
		backoff.WithNotify(func(err error, next time.Duration) {
			if p.Notify != nil {
				p.Notify(err, next)
			}
		}))
	if err != nil && ctx.Err() != nil && last != nil && !errors.Is(err, last) {
		return v, fmt.Errorf("%w (gave up: %w)", last, context.Cause(ctx))
	}
	return v, err
}
