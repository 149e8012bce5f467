package rest

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"unicode"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/taskrunner/taskrunner/gateway/httperr"
)

// errorHandler is grpc-gateway's error handler: every error of a REST call
// (decoding, the service's answer, a body over the limit) is answered
// through httperr, with decode errors turned into field-named ones.
func errorHandler(maxBody int64, log *slog.Logger) runtime.ErrorHandlerFunc {
	return func(ctx context.Context, _ *runtime.ServeMux, _ runtime.Marshaler, w http.ResponseWriter, r *http.Request, err error) {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) || strings.Contains(err.Error(), "http: request body too large") {
			httperr.WriteHTTP(w, http.StatusRequestEntityTooLarge, httperr.TooLarge(maxBody, -1))
			return
		}
		httperr.Write(w, restStatus(ctx, log, err))
	}
}

// restStatus maps an error of a REST call to the status the client gets.
func restStatus(ctx context.Context, log *slog.Logger, err error) *status.Status {
	var hse *runtime.HTTPStatusError
	if errors.As(err, &hse) {
		// grpc-gateway's own: a malformed %-sequence in the path.
		return httperr.Invalid("path", httperr.Truncate(hse.Err.Error(), 200))
	}
	st, ok := status.FromError(err)
	if !ok {
		log.ErrorContext(ctx, "rest: unexpected error", "error", err)
		return status.New(codes.Internal, "internal error")
	}
	switch st.Code() {
	case codes.InvalidArgument:
		if hasDetail[*errdetails.BadRequest](st) {
			return st
		}
		if d := decodeStatus(st.Message()); d != nil {
			return d
		}
		if m := fieldMessage.FindStringSubmatch(st.Message()); m != nil {
			return httperr.Invalid(m[1], m[2])
		}
		return httperr.Invalid("body", httperr.Truncate(st.Message(), 200))
	case codes.Unavailable, codes.Unknown:
		if len(st.Details()) == 0 {
			// The transport's message (dial errors, addresses) is not for
			// clients: log it and answer a plain one.
			log.WarnContext(ctx, "rest: service call failed", "error", err)
			return httperr.Unavailable("the task service is unavailable; retry later")
		}
	}
	return st
}

func hasDetail[T any](st *status.Status) bool {
	for _, d := range st.Details() {
		if _, ok := d.(T); ok {
			return true
		}
	}
	return false
}

var (
	// "field: description", the services' validation messages.
	fieldMessage = regexp.MustCompile(`^([a-z][a-z0-9_.]*): (.+)$`)
	// protojson, after its "proto: (line L:C): " head. protobuf-go puts a
	// space or, at random, a no-break space after "proto:" to keep callers
	// from matching its text; we match both, and TestErrorContract fails
	// if an upgrade changes the wording.
	protoHead       = regexp.MustCompile(`^proto:[\s\x{00a0}]*(syntax error )?\(line (\d+):(\d+)\): (.*)$`)
	unknownField    = regexp.MustCompile(`^unknown field "(.*)"$`)
	duplicateField  = regexp.MustCompile(`^duplicate field "(.*)"$`)
	invalidValue    = regexp.MustCompile(`^invalid value for (\w+) field (\w+): (.*)$`)
	queryParse      = regexp.MustCompile(`^parsing (?:field|list) "(\w+)": (.*)$`)
	pathParam       = regexp.MustCompile(`^type mismatch, parameter: (\w+), error: (.*)$`)
	missingParam    = regexp.MustCompile(`^missing parameter (\w+)$`)
	jsonSyntaxError = regexp.MustCompile(`^(unexpected EOF|invalid character .*|unexpected end of JSON input|json: .*)$`)
)

// decodeStatus turns the decoding errors grpc-gateway passes through as
// InvalidArgument with protojson's or encoding/json's text ("proto: (line
// 1:35): unknown field \"foo\"") into a field-named status, or returns nil
// for a message it does not recognise. Field names are the proto names
// the API uses (protojson reports JSON names: baseBranch → base_branch).
func decodeStatus(msg string) *status.Status {
	if m := protoHead.FindStringSubmatch(msg); m != nil {
		at := "line " + m[2] + ":" + m[3]
		rest := m[4]
		if m[1] != "" {
			return httperr.Invalid("body", "malformed JSON at "+at+": "+httperr.Truncate(rest, 100))
		}
		if f := unknownField.FindStringSubmatch(rest); f != nil {
			return httperr.Invalid(fieldName(f[1]), "unknown field (at "+at+")")
		}
		if f := duplicateField.FindStringSubmatch(rest); f != nil {
			return httperr.Invalid(fieldName(f[1]), "duplicate field (at "+at+")")
		}
		if f := invalidValue.FindStringSubmatch(rest); f != nil {
			return httperr.Invalid(snake(f[2]), "invalid "+f[1]+" value "+httperr.Truncate(f[3], httperr.MaxEcho))
		}
		return httperr.Invalid("body", httperr.Truncate(rest, 200)+" (at "+at+")")
	}
	if m := queryParse.FindStringSubmatch(msg); m != nil {
		return httperr.Invalid(m[1], "invalid value: "+httperr.Truncate(queryCause(m[2]), 120))
	}
	if m := pathParam.FindStringSubmatch(msg); m != nil {
		return httperr.Invalid(m[1], "invalid value: "+httperr.Truncate(m[2], 120))
	}
	if m := missingParam.FindStringSubmatch(msg); m != nil {
		return httperr.Invalid(m[1], "required")
	}
	if jsonSyntaxError.MatchString(msg) {
		return httperr.Invalid("body", "malformed JSON: "+httperr.Truncate(msg, 100))
	}
	return nil
}

// queryCause shortens strconv's "strconv.ParseInt: parsing \"x\": invalid
// syntax" to "\"x\" is not a number".
func queryCause(s string) string {
	if strings.HasPrefix(s, "strconv.") {
		if _, after, ok := strings.Cut(s, ": parsing "); ok {
			v, why, _ := strings.Cut(after, ": ")
			return v + ": " + why
		}
	}
	return s
}

// fieldName is a field name as the client sent it, made safe to echo.
func fieldName(s string) string { return httperr.Truncate(s, httperr.MaxEcho) }

// snake converts protojson's JSON name of a field to its proto name; buf
// lint (STANDARD) keeps proto field names lower_snake_case, so it is exact.
func snake(s string) string {
	var b strings.Builder
	for _, r := range s {
		if unicode.IsUpper(r) {
			b.WriteByte('_')
			r = unicode.ToLower(r)
		}
		b.WriteRune(r)
	}
	return b.String()
}

// notFound answers a request no route took: 405 with Allow when the
// document has the path for other methods, 404 otherwise. It serves both
// the ServeMux's catch-all and grpc-gateway's routing errors.
func notFound(routes *routeTable) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if allow := routes.allowed(r.URL.EscapedPath()); len(allow) > 0 && !slices.Contains(allow, r.Method) {
			httperr.WriteMethodNotAllowed(w, r, allow)
			return
		}
		httperr.Write(w, httperr.RouteNotFound(r.Method, r.URL.EscapedPath()))
	}
}

// plainErrors wraps the handlers mounted next to the API (SSE, console):
// an error they answer with net/http's plain text (http.Error,
// http.NotFound) is replaced by the API's JSON shape, so every answer of
// the gateway has one error contract even where a package uses the
// standard helpers. Other answers, streams included, pass through.
func plainErrors(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		next.ServeHTTP(&errorShape{ResponseWriter: w, r: r}, r)
	})
}

type errorShape struct {
	http.ResponseWriter
	r        *http.Request
	replaced bool // the answer was rewritten; drop what the handler writes
	wrote    bool
}

func (e *errorShape) WriteHeader(code int) {
	if e.wrote {
		return
	}
	e.wrote = true
	if code < 400 || !strings.HasPrefix(e.Header().Get("Content-Type"), "text/plain") {
		e.ResponseWriter.WriteHeader(code)
		return
	}
	e.replaced = true
	switch code {
	case http.StatusNotFound:
		httperr.Write(e.ResponseWriter, httperr.RouteNotFound(e.r.Method, e.r.URL.EscapedPath()))
	case http.StatusMethodNotAllowed:
		allow := strings.Split(strings.ReplaceAll(e.Header().Get("Allow"), " ", ""), ",")
		httperr.WriteMethodNotAllowed(e.ResponseWriter, e.r, allow)
	default:
		httperr.WriteHTTP(e.ResponseWriter, code, status.New(httpCode(code), http.StatusText(code)))
	}
}

func (e *errorShape) Write(b []byte) (int, error) {
	if !e.wrote {
		e.WriteHeader(http.StatusOK)
	}
	if e.replaced {
		return len(b), nil
	}
	return e.ResponseWriter.Write(b)
}

// Flush and Unwrap keep streaming working (http.ResponseController).
func (e *errorShape) Flush() {
	if f, ok := e.ResponseWriter.(http.Flusher); ok && !e.replaced {
		f.Flush()
	}
}

func (e *errorShape) Unwrap() http.ResponseWriter { return e.ResponseWriter }

// httpCode is the gRPC code of an HTTP error status (the inverse of
// runtime.HTTPStatusFromCode where one exists).
func httpCode(s int) codes.Code {
	switch s {
	case http.StatusBadRequest, http.StatusRequestEntityTooLarge:
		return codes.InvalidArgument
	case http.StatusUnauthorized:
		return codes.Unauthenticated
	case http.StatusForbidden:
		return codes.PermissionDenied
	case http.StatusNotFound:
		return codes.NotFound
	case http.StatusConflict:
		return codes.AlreadyExists
	case http.StatusTooManyRequests:
		return codes.ResourceExhausted
	case http.StatusNotImplemented, http.StatusMethodNotAllowed:
		return codes.Unimplemented
	case http.StatusServiceUnavailable:
		return codes.Unavailable
	case http.StatusGatewayTimeout:
		return codes.DeadlineExceeded
	}
	return codes.Unknown
}
