package rpcretry

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestRetryable(t *testing.T) {
	cases := []struct {
		err  error
		want bool
	}{
		{status.Error(codes.Unavailable, "connection refused"), true},
		{status.Error(codes.DeadlineExceeded, "slow"), true},
		{status.Error(codes.Aborted, "restarting"), true},
		{status.Error(codes.ResourceExhausted, "overloaded"), true},
		{status.Error(codes.Internal, "database is down"), true},
		{status.Error(codes.Unknown, "?"), true},
		{status.Error(codes.Canceled, "RST_STREAM CANCEL"), true},
		{io.ErrUnexpectedEOF, true},
		{status.Error(codes.PermissionDenied, "certificate is for another task"), false},
		{status.Error(codes.Unauthenticated, "no certificate"), false},
		{status.Error(codes.FailedPrecondition, "task finished"), false},
		{status.Error(codes.InvalidArgument, "bad seq"), false},
		{status.Error(codes.NotFound, "no task"), false},
		{status.Error(codes.Unimplemented, "old server"), false},
		{nil, false},
	}
	for _, tc := range cases {
		require.Equal(t, tc.want, Retryable(tc.err), "%v", tc.err)
	}
}

func TestBackOffIsCappedAndJittered(t *testing.T) {
	b := NewBackOff(100*time.Millisecond, time.Second)
	var delays []time.Duration
	for range 200 {
		delays = append(delays, b.NextBackOff())
	}
	require.GreaterOrEqual(t, delays[0], 50*time.Millisecond)
	require.LessOrEqual(t, delays[0], 150*time.Millisecond)
	distinct := map[time.Duration]bool{}
	for _, d := range delays {
		require.LessOrEqual(t, d, time.Second+time.Millisecond, "no delay beyond the cap")
		distinct[d] = true
	}
	require.Greater(t, len(distinct), 100, "delays are jittered")
	for _, d := range delays[10:] {
		require.GreaterOrEqual(t, d, 300*time.Millisecond, "the cap is reached")
	}
}

func TestDoRetriesUntilSuccess(t *testing.T) {
	calls := 0
	var notified []error
	v, err := Do(context.Background(), Policy{MinDelay: time.Millisecond, MaxDelay: 2 * time.Millisecond,
		Notify: func(err error, _ time.Duration) { notified = append(notified, err) }},
		func(context.Context) (string, error) {
			calls++
			switch calls {
			case 1:
				return "", status.Error(codes.Unavailable, "restarting")
			case 2:
				return "", status.Error(codes.Internal, "database is down")
			}
			return "token", nil
		})
	require.NoError(t, err)
	require.Equal(t, "token", v)
	require.Equal(t, 3, calls)
	require.Len(t, notified, 2)
}

func TestDoStopsAtARefusal(t *testing.T) {
	calls := 0
	_, err := Do(context.Background(), Policy{MinDelay: time.Millisecond}, func(context.Context) (int, error) {
		calls++
		return 0, status.Error(codes.PermissionDenied, "not your task")
	})
	require.Equal(t, codes.PermissionDenied, status.Code(err))
	require.Equal(t, 1, calls)
}

func TestDoGivesUpWithTheContextAndSaysWhy(t *testing.T) {
	ctx, cancel := context.WithCancelCause(context.Background())
	calls := 0
	_, err := Do(ctx, Policy{MinDelay: time.Millisecond, MaxDelay: 2 * time.Millisecond, AttemptTimeout: time.Second},
		func(actx context.Context) (int, error) {
			calls++
			_, hasDeadline := actx.Deadline()
			require.True(t, hasDeadline, "each attempt is bounded")
			if calls == 5 {
				cancel(errors.New("task deadline"))
			}
			return 0, status.Error(codes.Unavailable, "connection refused")
		})
	require.Equal(t, 5, calls)
	require.ErrorContains(t, err, "connection refused")
	require.ErrorContains(t, err, "task deadline")
	require.Equal(t, codes.Unavailable, status.Code(err), "the last failure stays inspectable")
}
