package errs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Domain is the ErrorInfo domain of every reason this package emits.
const Domain = "taskrunner.dev"

// Kinds of domain error. Compare with errors.Is.
var (
	ErrNotFound          = errors.New("not found")
	ErrInvalidArgument   = errors.New("invalid argument")
	ErrInvalidTransition = errors.New("invalid transition")
	ErrConflict          = errors.New("conflict")
	ErrQuotaExceeded     = errors.New("quota exceeded")
	ErrUnauthenticated   = errors.New("unauthenticated")
	ErrPermissionDenied  = errors.New("permission denied")
	ErrUnavailable       = errors.New("unavailable")
)

// Error is a domain error with a client-safe message, an optional field name
// (for invalid arguments) and a machine-readable reason.
type Error struct {
	Kind    error
	Message string
	Field   string
	Reason  string
	// RetryAfterSeconds is set on quota errors.
	RetryAfterSeconds int64
}

func (e *Error) Error() string { return e.Message }

// Unwrap lets errors.Is match the kind.
func (e *Error) Unwrap() error { return e.Kind }

// Invalid reports a bad field. The message names the field.
func Invalid(field, format string, args ...any) error {
	return &Error{Kind: ErrInvalidArgument, Field: field, Reason: "INVALID_ARGUMENT",
		Message: field + ": " + fmt.Sprintf(format, args...)}
}

// NotFound reports a missing resource (or one the caller may not see).
func NotFound(what, id string) error {
	return &Error{Kind: ErrNotFound, Reason: "NOT_FOUND", Message: fmt.Sprintf("%s %q not found", what, id)}
}

// Transition reports an illegal state-machine move.
func Transition(format string, args ...any) error {
	return &Error{Kind: ErrInvalidTransition, Reason: "INVALID_TRANSITION", Message: fmt.Sprintf(format, args...)}
}

// Conflict reports a request that contradicts an earlier one.
func Conflict(format string, args ...any) error {
	return &Error{Kind: ErrConflict, Reason: "CONFLICT", Message: fmt.Sprintf(format, args...)}
}

// Quota reports an exceeded limit with a retry-after hint.
func Quota(retryAfterSeconds int64, format string, args ...any) error {
	return &Error{Kind: ErrQuotaExceeded, Reason: "QUOTA_EXCEEDED", RetryAfterSeconds: retryAfterSeconds,
		Message: fmt.Sprintf(format, args...)}
}

// Unauthenticated reports missing or bad credentials.
func Unauthenticated(msg string) error {
	return &Error{Kind: ErrUnauthenticated, Reason: "UNAUTHENTICATED", Message: msg}
}

// PermissionDenied reports a caller that may not do this.
func PermissionDenied(msg string) error {
	return &Error{Kind: ErrPermissionDenied, Reason: "PERMISSION_DENIED", Message: msg}
}

// Unavailable reports a dependency that is down; clients may retry after
// DependencyRetryAfterSeconds (RetryInfo, and Retry-After over REST).
func Unavailable(msg string) error {
	return &Error{Kind: ErrUnavailable, Reason: "UNAVAILABLE", Message: msg, RetryAfterSeconds: DependencyRetryAfterSeconds}
}

var codeOf = []struct {
	kind error
	code codes.Code
}{
	{ErrNotFound, codes.NotFound},
	{ErrInvalidArgument, codes.InvalidArgument},
	{ErrInvalidTransition, codes.FailedPrecondition},
	{ErrConflict, codes.AlreadyExists},
	{ErrQuotaExceeded, codes.ResourceExhausted},
	{ErrUnauthenticated, codes.Unauthenticated},
	{ErrPermissionDenied, codes.PermissionDenied},
	{ErrUnavailable, codes.Unavailable},
}

// DependencyRetryAfterSeconds is the Retry-After hint of a dependency outage
// (DependencyDown): runners and the gateway's clients come back about then.
const DependencyRetryAfterSeconds = 1

// DependencyDown reports whether err says that PostgreSQL or Redis cannot be
// reached or dropped the connection: a refused or reset connection, a
// connection the driver already closed, an administrator or crash shutdown
// (SQLSTATE 57P01, 57P02, 57P03), a connection exception (class 08) or too
// many connections (53300). Such a failure is temporary and says nothing
// about the request, so it is Unavailable, never Internal.
//
// It looks only at interfaces and the standard library so that this leaf
// package (which the gateway's tests import) does not link the drivers:
// pgconn.PgError has SQLState(); pgconn's "conn closed" and other errors
// raised before anything was sent have SafeToRetry() true; dial and socket
// failures are *net.OpError.
func DependencyDown(err error) bool {
	if err == nil {
		return false
	}
	var sql interface{ SQLState() string }
	if errors.As(err, &sql) {
		c := sql.SQLState()
		return strings.HasPrefix(c, "08") || c == "57P01" || c == "57P02" || c == "57P03" || c == "53300"
	}
	var safe interface{ SafeToRetry() bool }
	if errors.As(err, &safe) && safe.SafeToRetry() {
		return true
	}
	var op *net.OpError
	return errors.As(err, &op) || errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.EPIPE) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed)
}

// dependencyDown is the domain error a DependencyDown failure becomes; the
// cause is logged by the caller of ToStatus, never sent.
var dependencyDown = &Error{Kind: ErrUnavailable, Reason: "UNAVAILABLE",
	Message: "a database the service needs is unavailable; retry later", RetryAfterSeconds: DependencyRetryAfterSeconds}

// ToStatus maps err to a gRPC status. Errors that are not domain errors (and
// not already statuses) become Internal with a generic message, except a
// dependency outage (DependencyDown), which becomes Unavailable with a
// retry delay. The caller logs the original when ok is false: for those two.
func ToStatus(err error) (st *status.Status, ok bool) {
	if err == nil {
		return nil, true
	}
	if s, isStatus := status.FromError(err); isStatus {
		return s, true
	}
	switch {
	case errors.Is(err, context.Canceled):
		return status.New(codes.Canceled, "request cancelled"), true
	case errors.Is(err, context.DeadlineExceeded):
		return status.New(codes.DeadlineExceeded, "deadline exceeded"), true
	}
	var de *Error
	if !errors.As(err, &de) {
		if DependencyDown(err) {
			st, _ := ToStatus(dependencyDown)
			return st, false
		}
		return status.New(codes.Internal, "internal error"), false
	}
	code := codes.Internal
	for _, c := range codeOf {
		if errors.Is(de.Kind, c.kind) {
			code = c.code
			break
		}
	}
	st = status.New(code, de.Message)
	var details []protoadapt.MessageV1
	info := &errdetails.ErrorInfo{Reason: de.Reason, Domain: Domain}
	if de.Field != "" {
		info.Metadata = map[string]string{"field": de.Field}
		details = append(details, &errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{{
			Field: de.Field, Description: de.Message,
		}}})
	}
	if de.RetryAfterSeconds > 0 {
		if info.Metadata == nil {
			info.Metadata = map[string]string{}
		}
		info.Metadata["retry_after_seconds"] = fmt.Sprint(de.RetryAfterSeconds)
		if code == codes.Unavailable {
			// The standard detail gRPC clients read (the gateway's
			// Retry-After comes from the ErrorInfo metadata above).
			details = append(details, &errdetails.RetryInfo{RetryDelay: durationpb.New(time.Duration(de.RetryAfterSeconds) * time.Second)})
		}
	}
	details = append([]protoadapt.MessageV1{info}, details...)
	if withDetails, err := st.WithDetails(details...); err == nil {
		st = withDetails
	}
	return st, true
}
