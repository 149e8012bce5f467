package rest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/textproto"
	"sort"
	"strings"
	"time"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/taskrunner/taskrunner/gateway/httperr"
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
	// Extra routes (SSE, console) mounted next to the API, under its body
	// limit and CORS.
	Extra map[string]http.Handler
	// Unlimited routes (the webhook, /metrics) are mounted outside the
	// body limit and CORS: the webhook has a limit of its own, and neither
	// is for browsers.
	Unlimited map[string]http.Handler
	// CORS for browser pages of other origins; off when empty.
	CORS CORS
}

// services are the gRPC services the REST API exposes (their HTTP rules
// are in proto/taskrunner/v1/taskrunner_http.yaml); name is the prefix of
// their operationIds in the OpenAPI document.
var services = []struct {
	name     string
	conn     func(Options) *grpc.ClientConn
	register func(context.Context, *runtime.ServeMux, *grpc.ClientConn) error
}{
	{"TaskService", func(o Options) *grpc.ClientConn { return o.Task }, taskrunnerv1.RegisterTaskServiceHandler},
	{"EventsService", func(o Options) *grpc.ClientConn { return o.Events }, taskrunnerv1.RegisterEventsServiceHandler},
	{"TokenService", func(o Options) *grpc.ClientConn { return o.Task }, taskrunnerv1.RegisterTokenServiceHandler},
}

// Server is the gateway's whole HTTP handler.
type Server struct {
	handler  http.Handler
	doc      []byte
	patterns []string
}

// ServeHTTP serves every route of the gateway.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.handler.ServeHTTP(w, r) }

// OpenAPI is the document served at /openapi.json.
func (s *Server) OpenAPI() []byte { return s.doc }

// Patterns lists the ServeMux patterns mounted next to the gRPC routes
// (which the document lists from the HTTP rules), sorted.
func (s *Server) Patterns() []string { return s.patterns }

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

// Handler returns the gateway's whole HTTP handler (a *Server).
//
// Order of the layers, outermost first: request id → the unlimited routes
// → CORS → body limit → routes (SSE, health, console, OpenAPI, and the
// gRPC routes behind a check of the document) → a catch-all that answers
// 404 or 405 in the API's error shape.
func Handler(ctx context.Context, o Options) (http.Handler, error) {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if err := o.CORS.Validate(); err != nil {
		return nil, err
	}
	var lost http.Handler // the 404/405 handler, once the document is built
	gw := runtime.NewServeMux(
		runtime.WithIncomingHeaderMatcher(headerToMetadata),
		// Nothing of the services' response metadata becomes an HTTP
		// header (x-request-id is set by our middleware already; grpc
		// content-type would leak as Grpcgateway-Content-Type).
		runtime.WithOutgoingHeaderMatcher(func(string) (string, bool) { return "", false }),
		runtime.WithOutgoingTrailerMatcher(func(string) (string, bool) { return "", false }),
		runtime.WithMarshalerOption(runtime.MIMEWildcard, &runtime.JSONPb{
			MarshalOptions:   protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true},
			UnmarshalOptions: protojson.UnmarshalOptions{DiscardUnknown: false},
		}),
		runtime.WithErrorHandler(errorHandler(o.MaxBodyBytes, o.Logger)),
		// guard sends grpc-gateway only routes it has, so this is a
		// safety net that answers like everything else.
		runtime.WithRoutingErrorHandler(func(_ context.Context, _ *runtime.ServeMux, _ runtime.Marshaler, w http.ResponseWriter, r *http.Request, _ int) {
			lost.ServeHTTP(w, r)
		}),
		// A form-encoded POST must not fall back to a GET route: that
		// made POST /v1/tasks/{id}:frobnicate a GetTask of "{id}:frobnicate".
		runtime.WithDisablePathLengthFallback(),
		runtime.WithDisableHTTPMethodOverride(),
	)
	registered := map[string]bool{}
	for _, s := range services {
		conn := s.conn(o)
		if conn == nil {
			continue
		}
		if err := s.register(ctx, gw, conn); err != nil {
			return nil, err
		}
		registered[s.name] = true
	}
	if !registered["TaskService"] {
		return nil, errors.New("rest: Options.Task is required")
	}

	inner := http.NewServeMux()
	patterns := map[string]bool{}
	mount := func(mux *http.ServeMux, pattern string, h http.Handler) {
		mux.Handle(pattern, h)
		patterns[pattern] = true
	}
	mount(inner, "GET /healthz", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"status":"ok"}` + "\n"))
	}))
	mount(inner, "GET /readyz", readyz(o.Task))
	for p, h := range o.Extra {
		mount(inner, p, plainErrors(h))
	}
	outer := http.NewServeMux()
	for p, h := range o.Unlimited {
		mount(outer, p, h)
	}
	patterns["GET /openapi.json"] = true
	doc, err := document(openapi.JSON, overlay, registered, patterns)
	if err != nil {
		return nil, err
	}
	routes, err := newRouteTable(doc)
	if err != nil {
		return nil, err
	}
	inner.HandleFunc("GET /openapi.json", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(doc)
	})
	lost = notFound(routes)
	inner.Handle("/v1/", guard(routes, gw, lost))
	inner.Handle("/", lost)
	outer.Handle("/", o.CORS.handler(bodyLimit(o.MaxBodyBytes, inner)))

	s := &Server{handler: requestID(outer), doc: doc}
	for p := range patterns {
		s.patterns = append(s.patterns, p)
	}
	sort.Strings(s.patterns)
	return s, nil
}

// guard passes to grpc-gateway only the paths and methods the document
// lists, and answers the rest itself: an unknown custom method such as
// POST /v1/tasks/{id}:frobnicate is 404 (grpc-gateway would call it a 405
// of GET /v1/tasks/{id}, or a GetTask of "{id}:frobnicate").
func guard(routes *routeTable, gw *runtime.ServeMux, lost http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		allow := routes.allowed(r.URL.EscapedPath())
		for _, m := range allow {
			if m == r.Method {
				gw.ServeHTTP(w, r)
				return
			}
		}
		lost.ServeHTTP(w, r)
	})
}

// readyWait is how long /readyz waits for a connection that is not READY
// to become ready: the gateway's reconnect backoff is capped under 1 s, so
// a taskrunnerd that is listening again is reached within it.
const readyWait = time.Second

// readyz follows the real connection state: it is ready only when the
// task service's conn is READY, or becomes READY within readyWait (an IDLE
// conn is asked to connect; one in TRANSIENT_FAILURE is waited for through
// its next attempt), and the health service answers SERVING.
func readyz(conn *grpc.ClientConn) http.HandlerFunc {
	hc := healthpb.NewHealthClient(conn)
	return func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), readyWait)
		defer cancel()
		if conn.GetState() == connectivity.Idle {
			conn.Connect()
		}
		resp, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true))
		w.Header().Set("Content-Type", "application/json")
		if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			httperr.Write(w, httperr.Unavailable(fmt.Sprintf("not ready: the task service is not serving (connection %s)",
				strings.ToLower(conn.GetState().String()))))
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
		if id == "" || len(id) > 128 || strings.ContainsFunc(id, func(c rune) bool { return c < 0x21 || c > 0x7e }) {
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
			httperr.WriteHTTP(w, http.StatusRequestEntityTooLarge, httperr.TooLarge(max, r.ContentLength))
			return
		}
		if r.Body != nil {
			r.Body = http.MaxBytesReader(w, r.Body, max)
		}
		next.ServeHTTP(w, r)
	})
}
