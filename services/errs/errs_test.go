package errs_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/taskrunner/taskrunner/services/errs"
	"github.com/taskrunner/taskrunner/services/store/storetest"
)

func TestDependencyDownTable(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		down bool
	}{
		{"admin shutdown", &pgconn.PgError{Code: "57P01"}, true},
		{"crash shutdown", &pgconn.PgError{Code: "57P02"}, true},
		{"cannot connect now", &pgconn.PgError{Code: "57P03"}, true},
		{"connection failure", &pgconn.PgError{Code: "08006"}, true},
		{"too many connections", &pgconn.PgError{Code: "53300"}, true},
		{"wrapped admin shutdown", fmt.Errorf("task: get: %w", &pgconn.PgError{Code: "57P01"}), true},
		{"unique violation", &pgconn.PgError{Code: "23505"}, false},
		{"syntax error", &pgconn.PgError{Code: "42601"}, false},
		{"conn closed", fmt.Errorf("query: %w", pgconn.ErrConnClosed), false}, // the bare sentinel carries no SafeToRetry
		{"refused dial", &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}, true},
		{"plain error", errors.New("boom"), false},
		{"nil", nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.down, errs.DependencyDown(tc.err))
		})
	}
}

// requireUnavailable checks the status a dependency outage becomes: code,
// a message without the cause, ErrorInfo with retry_after_seconds (the
// gateway's Retry-After) and RetryInfo.
func requireUnavailable(t *testing.T, err error) {
	t.Helper()
	require.True(t, errs.DependencyDown(err), "%v", err)
	st, ok := errs.ToStatus(err)
	require.False(t, ok, "the cause must be logged by the caller")
	require.Equal(t, codes.Unavailable, st.Code())
	require.NotContains(t, st.Message(), "SQLSTATE")
	require.NotContains(t, st.Message(), "127.0.0.1")
	var info *errdetails.ErrorInfo
	var retry *errdetails.RetryInfo
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			info = d
		case *errdetails.RetryInfo:
			retry = d
		}
	}
	require.NotNil(t, info)
	require.Equal(t, "UNAVAILABLE", info.GetReason())
	require.Equal(t, "1", info.GetMetadata()["retry_after_seconds"])
	require.NotNil(t, retry)
	require.Equal(t, time.Second, retry.GetRetryDelay().AsDuration())
}

// A real refused connection: a port nothing listens on.
func TestRefusedConnectionIsUnavailable(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := lis.Addr().String()
	require.NoError(t, lis.Close())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = pgx.Connect(ctx, "postgres://postgres@"+addr+"/postgres?sslmode=disable&connect_timeout=5")
	require.Error(t, err)
	requireUnavailable(t, err)
}

// A real administrator shutdown of a session (pg_terminate_backend sends
// the victim 57P01), and the closed connection after it.
func TestTerminatedSessionIsUnavailable(t *testing.T) {
	db := storetest.NewDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	victim, err := pgx.Connect(ctx, db.URL)
	require.NoError(t, err)
	defer victim.Close(context.Background())
	var pid int
	require.NoError(t, victim.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid))
	var killed bool
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT pg_terminate_backend($1)`, pid).Scan(&killed))
	require.True(t, killed)

	_, err = victim.Exec(ctx, `SELECT 1`)
	require.Error(t, err)
	requireUnavailable(t, err)
	_, err = victim.Exec(ctx, `SELECT 1`) // the driver closed it
	require.Error(t, err)
	requireUnavailable(t, err)
}

func TestDomainErrorsKeepTheirCodes(t *testing.T) {
	st, ok := errs.ToStatus(errs.NotFound("task", "x"))
	require.True(t, ok)
	require.Equal(t, codes.NotFound, st.Code())
	st, ok = errs.ToStatus(errors.New("a bug"))
	require.False(t, ok)
	require.Equal(t, codes.Internal, st.Code())
	st, ok = errs.ToStatus(errs.Unavailable("events could not be stored"))
	require.True(t, ok)
	require.Equal(t, codes.Unavailable, st.Code())
	require.Equal(t, "events could not be stored", st.Message())
	already := status.Error(codes.Aborted, "x")
	st, _ = errs.ToStatus(already)
	require.Equal(t, codes.Aborted, st.Code())
}
