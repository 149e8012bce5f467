package rest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"log/slog"
	"net/http"
	"net/textproto"
	"strconv"
	"strings"
	"time"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
	"github.com/taskrunner/taskrunner/proto/openapi"
)

// RequestIDHeader carries the request id in and out.
const RequestIDHeader = "X-Request-Id"

// Options configure Handler.
type Options struct {
	Task         *grpc.ClientConn
	Events       *grpc.ClientConn
	MaxBodyBytes int64
	Logger       *slog.Logger
	// Extra routes (SSE, webhook, console) mounted next to the API.
	Extra map[string]http.Handler
}

// headerToMetadata forwards the headers services read; grpc-gateway already
// forwards Authorization.
func headerToMetadata(key string) (string, bool) {
	switch textproto.CanonicalMIMEHeaderKey(key) {
	case "Idempotency-Key":
		return "idempotency-key", true
	case RequestIDHeader:
		return "x-request-id", true
	}
	return runtime.DefaultHeaderMatcher(key)
}

// Handler returns the gateway's whole HTTP handler.
func Handler(ctx context.Context, o Options) (http.Handler, error) {
	gw := runtime.NewServeMux(
		runtime.WithIncomingHeaderMatcher(headerToMetadata),
		runtime.WithOutgoingHeaderMatcher(func(k string) (string, bool) {
			if k == "x-request-id" {
				return "", false // set by our middleware already
			}
			return runtime.DefaultHeaderMatcher(k)
		}),
		runtime.WithMarshalerOption(runtime.MIMEWildcard, &runtime.JSONPb{
			MarshalOptions:   protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true},
			UnmarshalOptions: protojson.UnmarshalOptions{DiscardUnknown: false},
		}),
		runtime.WithErrorHandler(errorHandler),
		runtime.WithRoutingErrorHandler(routingErrorHandler),
	)
	if err := taskrunnerv1.RegisterTaskServiceHandler(ctx, gw, o.Task); err != nil {
		return nil, err
	}
	if o.Events != nil {
		if err := taskrunnerv1.RegisterEventsServiceHandler(ctx, gw, o.Events); err != nil {
			return nil, err
		}
	}
	mux := http.NewServeMux()
	mux.Handle("/v1/", gw)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"status":"ok"}` + "\n"))
	})
	mux.HandleFunc("GET /readyz", readyz(o.Task))
	mux.HandleFunc("GET /openapi.json", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(openapi.JSON)
	})
	for pattern, h := range o.Extra {
		mux.Handle(pattern, h)
	}
	return requestID(bodyLimit(o.MaxBodyBytes, mux)), nil
}

func readyz(conn *grpc.ClientConn) http.HandlerFunc {
	hc := healthpb.NewHealthClient(conn)
	return func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		resp, err := hc.Check(ctx, &healthpb.HealthCheckRequest{})
		w.Header().Set("Content-Type", "application/json")
		if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte(`{"status":"not ready"}` + "\n"))
			return
		}
		_, _ = w.Write([]byte(`{"status":"ready"}` + "\n"))
	}
}

func newRequestID() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// requestID gives every request an id (the caller's, when sane) and echoes it.
func requestID(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get(RequestIDHeader)
		if id == "" || len(id) > 128 {
			id = newRequestID()
			r.Header.Set(RequestIDHeader, id)
		}
		w.Header().Set(RequestIDHeader, id)
		next.ServeHTTP(w, r)
	})
}

// bodyLimit refuses bodies over max with 413 before anything reads them, and
// caps chunked bodies while they are read.
func bodyLimit(max int64, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength > max {
			writeError(w, http.StatusRequestEntityTooLarge, codes.InvalidArgument,
				"request body is "+strconv.FormatInt(r.ContentLength, 10)+" bytes; the limit is "+strconv.FormatInt(max, 10))
			return
		}
		if r.Body != nil {
			r.Body = http.MaxBytesReader(w, r.Body, max)
		}
		next.ServeHTTP(w, r)
	})
}

func writeError(w http.ResponseWriter, httpStatus int, code codes.Code, msg string) {
	st := status.New(code, msg)
	b, _ := protojson.Marshal(st.Proto())
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(httpStatus)
	_, _ = w.Write(b)
}

// errorHandler writes {code, message, details} with the HTTP status of the
// gRPC code, a Retry-After header on quota errors, and 413 for bodies that
// turned out too large while being read.
func errorHandler(ctx context.Context, mux *runtime.ServeMux, m runtime.Marshaler, w http.ResponseWriter, r *http.Request, err error) {
	var tooLarge *http.MaxBytesError
	if errors.As(err, &tooLarge) || strings.Contains(err.Error(), "http: request body too large") {
		writeError(w, http.StatusRequestEntityTooLarge, codes.InvalidArgument, "request body exceeds the size limit")
		return
	}
	if st, ok := status.FromError(err); ok && st.Code() == codes.ResourceExhausted {
		for _, d := range st.Details() {
			if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetMetadata()["retry_after_seconds"] != "" {
				w.Header().Set("Retry-After", info.GetMetadata()["retry_after_seconds"])
			}
		}
	}
	runtime.DefaultHTTPErrorHandler(ctx, mux, m, &challengeWriter{ResponseWriter: w}, r, err)
}

// challengeWriter replaces the WWW-Authenticate value grpc-gateway derives
// from the status message with a proper Bearer challenge (RFC 6750).
type challengeWriter struct{ http.ResponseWriter }

func (c *challengeWriter) WriteHeader(code int) {
	if code == http.StatusUnauthorized {
		c.Header().Set("WWW-Authenticate", `Bearer realm="taskrunner"`)
	}
	c.Header().Del("Grpcgateway-Content-Type")
	c.ResponseWriter.WriteHeader(code)
}

func routingErrorHandler(ctx context.Context, mux *runtime.ServeMux, m runtime.Marshaler, w http.ResponseWriter, r *http.Request, httpStatus int) {
	msg := http.StatusText(httpStatus)
	code := codes.NotFound
	if httpStatus == http.StatusMethodNotAllowed {
		code = codes.Unimplemented
		msg = "method " + r.Method + " not allowed on " + r.URL.Path
	} else if httpStatus == http.StatusNotFound {
		msg = "no route for " + r.Method + " " + r.URL.Path
	}
	writeError(w, httpStatus, code, msg)
}
