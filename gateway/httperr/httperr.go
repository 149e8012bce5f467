package httperr

import (
	"net/http"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/protoadapt"
)

// Domain is the ErrorInfo domain of the reasons below; it is the services'
// domain too (services/errs.Domain), so clients branch on one.
const Domain = "taskrunner.dev"

// Reasons (ErrorInfo.reason) of the errors the gateway decides itself.
const (
	ReasonInvalidArgument  = "INVALID_ARGUMENT"
	ReasonRouteNotFound    = "ROUTE_NOT_FOUND"
	ReasonMethodNotAllowed = "METHOD_NOT_ALLOWED"
	ReasonBodyTooLarge     = "BODY_TOO_LARGE"
	ReasonUnauthenticated  = "UNAUTHENTICATED"
	ReasonUnavailable      = "UNAVAILABLE"
)

// MaxEcho is the most bytes of a client's value that a message repeats.
const MaxEcho = 64

// BearerChallenge is the WWW-Authenticate value of every 401 (RFC 6750).
const BearerChallenge = `Bearer realm="taskrunner"`

var marshal = protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true}

// Write answers st as JSON with the HTTP status of its code
// (runtime.HTTPStatusFromCode, the table grpc-gateway uses), a Bearer
// challenge on 401 and Retry-After when an ErrorInfo carries
// retry_after_seconds.
func Write(w http.ResponseWriter, st *status.Status) {
	WriteHTTP(w, runtime.HTTPStatusFromCode(st.Code()), st)
}

// WriteHTTP is Write with an explicit HTTP status, for answers no gRPC code
// maps to (405, 413).
func WriteHTTP(w http.ResponseWriter, httpStatus int, st *status.Status) {
	b := Marshal(st)
	h := w.Header()
	// Headers a handler set for a success must not survive into an error.
	for k := range h {
		if strings.HasPrefix(k, "Grpc") || k == "Content-Length" || k == "Content-Encoding" || k == "Etag" || k == "Last-Modified" {
			h.Del(k)
		}
	}
	h.Set("Content-Type", "application/json")
	h.Set("X-Content-Type-Options", "nosniff")
	if httpStatus == http.StatusUnauthorized {
		h.Set("WWW-Authenticate", BearerChallenge)
	}
	if s := retryAfter(st); s != "" {
		h.Set("Retry-After", s)
	}
	w.WriteHeader(httpStatus)
	_, _ = w.Write(b)
}

// Marshal renders st as {code, message, details} (details always present,
// proto field names), repairing text that is not valid UTF-8 so the
// encoding cannot fail and leave a client with an empty body.
func Marshal(st *status.Status) []byte {
	p := st.Proto()
	if !utf8.ValidString(p.GetMessage()) {
		p.Message = strings.ToValidUTF8(p.GetMessage(), "\uFFFD")
	}
	b, err := marshal.Marshal(p)
	if err != nil {
		// A detail that does not encode (invalid UTF-8 inside it, an
		// unregistered type): keep the code and message, drop the details.
		p.Details = nil
		b, _ = marshal.Marshal(p)
	}
	return append(b, '\n')
}

func retryAfter(st *status.Status) string {
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			if v := info.GetMetadata()["retry_after_seconds"]; v != "" {
				if _, err := strconv.ParseUint(v, 10, 32); err == nil {
					return v
				}
			}
		}
	}
	return ""
}

// Invalid is the status of one invalid field: InvalidArgument, a message
// that starts with the field name ("field: description"), an ErrorInfo
// INVALID_ARGUMENT with metadata field, and a BadRequest field violation.
// It is the shape services/errs gives the services' own validation errors.
func Invalid(field, description string) *status.Status {
	msg := field + ": " + description
	return withDetails(status.New(codes.InvalidArgument, msg),
		&errdetails.ErrorInfo{Reason: ReasonInvalidArgument, Domain: Domain, Metadata: map[string]string{"field": field}},
		&errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: field, Description: msg}}})
}

// RouteNotFound is the 404 of a path (or a custom method such as
// ":frobnicate") that the gateway does not serve.
func RouteNotFound(method, path string) *status.Status {
	return withDetails(status.New(codes.NotFound, "no route for "+method+" "+Truncate(path, 256)),
		&errdetails.ErrorInfo{Reason: ReasonRouteNotFound, Domain: Domain})
}

// MethodNotAllowed is the 405 of a path served for other methods only;
// write it with WriteMethodNotAllowed, which also sets Allow.
func MethodNotAllowed(method, path string, allow []string) *status.Status {
	return withDetails(status.New(codes.Unimplemented, "method "+Truncate(method, 16)+" not allowed on "+Truncate(path, 256)+"; allowed: "+strings.Join(allow, ", ")),
		&errdetails.ErrorInfo{Reason: ReasonMethodNotAllowed, Domain: Domain, Metadata: map[string]string{"allow": strings.Join(allow, ", ")}})
}

// WriteMethodNotAllowed answers 405 with an Allow header.
func WriteMethodNotAllowed(w http.ResponseWriter, r *http.Request, allow []string) {
	w.Header().Set("Allow", strings.Join(allow, ", "))
	WriteHTTP(w, http.StatusMethodNotAllowed, MethodNotAllowed(r.Method, r.URL.EscapedPath(), allow))
}

// TooLarge is the status of a body over limit bytes; write it with
// WriteHTTP(w, http.StatusRequestEntityTooLarge, …). got is the declared
// Content-Length, or -1 when the body turned out too large while read.
func TooLarge(limit, got int64) *status.Status {
	msg := "body: the request body exceeds the limit of " + strconv.FormatInt(limit, 10) + " bytes"
	md := map[string]string{"limit_bytes": strconv.FormatInt(limit, 10)}
	if got >= 0 {
		msg = "body: the request body is " + strconv.FormatInt(got, 10) + " bytes; the limit is " + strconv.FormatInt(limit, 10)
		md["content_length"] = strconv.FormatInt(got, 10)
	}
	return withDetails(status.New(codes.InvalidArgument, msg),
		&errdetails.ErrorInfo{Reason: ReasonBodyTooLarge, Domain: Domain, Metadata: md},
		&errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: "body", Description: msg}}})
}

// Unauthenticated is a 401 the gateway decides (no or malformed token).
func Unauthenticated(msg string) *status.Status {
	return withDetails(status.New(codes.Unauthenticated, msg),
		&errdetails.ErrorInfo{Reason: ReasonUnauthenticated, Domain: Domain})
}

// Unavailable is a 503 for a dependency that did not answer; msg must not
// carry internal detail (addresses, dial errors): log those instead.
func Unavailable(msg string) *status.Status {
	return withDetails(status.New(codes.Unavailable, msg),
		&errdetails.ErrorInfo{Reason: ReasonUnavailable, Domain: Domain})
}

func withDetails(st *status.Status, details ...protoadapt.MessageV1) *status.Status {
	if s, err := st.WithDetails(details...); err == nil {
		return s
	}
	return st
}

// Truncate returns s cut to at most max bytes without splitting a UTF-8
// character; a cut string ends in "…" (counted in max). Invalid bytes in s
// are replaced first, so the result is always valid UTF-8.
func Truncate(s string, max int) string {
	if !utf8.ValidString(s) {
		s = strings.ToValidUTF8(s, "\uFFFD")
	}
	if len(s) <= max {
		return s
	}
	const ellipsis = "…"
	if max < len(ellipsis) {
		return cutAt(s, max)
	}
	return cutAt(s, max-len(ellipsis)) + ellipsis
}

// cutAt is s[:n] moved back to a character boundary; n < len(s).
func cutAt(s string, n int) string {
	if n < 0 {
		n = 0
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// Quote is a client's value as a message echoes it: truncated to MaxEcho
// bytes and quoted.
func Quote(s string) string { return strconv.Quote(Truncate(s, MaxEcho)) }
