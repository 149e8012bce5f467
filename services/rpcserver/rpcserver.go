package rpcserver

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"runtime/debug"
	"strings"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/logging"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"

	"github.com/taskrunner/taskrunner/services/auth"
	"github.com/taskrunner/taskrunner/services/errs"
)

// RequestIDHeader is the metadata key (and HTTP header) carrying request ids.
const RequestIDHeader = "x-request-id"

// Authenticator resolves a bearer token.
type Authenticator interface {
	Authenticate(ctx context.Context, token string) (auth.Principal, error)
}

// Options configure New.
type Options struct {
	Logger *slog.Logger
	Auth   Authenticator
	// Anonymous lists full method names that skip bearer-token auth (they
	// authenticate otherwise, e.g. by client certificate, or are health).
	Anonymous map[string]bool
	// ServerOptions are appended (TLS credentials, stats handlers…).
	ServerOptions []grpc.ServerOption
	// Reflection registers the gRPC reflection service (grpcurl and
	// friends). Off on the runner port, and switchable on the public port.
	Reflection bool
}

type requestIDKey struct{}

// RequestID returns the request id of ctx.
func RequestID(ctx context.Context) string {
	id, _ := ctx.Value(requestIDKey{}).(string)
	return id
}

func newRequestID() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func isHealth(method string) bool {
	return strings.HasPrefix(method, "/grpc.health.v1.Health/") ||
		strings.HasPrefix(method, "/grpc.reflection.")
}

// isRead reports whether method (/pkg.Service/Method) only reads: Get… or
// List….
func isRead(method string) bool {
	name := method[strings.LastIndexByte(method, '/')+1:]
	return strings.HasPrefix(name, "Get") || strings.HasPrefix(name, "List")
}

// readLevel logs a read's success at Debug, anything else as the default
// does.
func readLevel(code codes.Code) logging.Level {
	if code == codes.OK {
		return logging.LevelDebug
	}
	return logging.DefaultServerCodeToLevel(code)
}

// New returns a gRPC server with the shared interceptor chain. The order is
// deliberate: recovery is outermost so a panic anywhere becomes Internal;
// the request id exists before anything logs; logging sees the final,
// mapped status; authentication runs before handlers; error mapping is
// innermost so handlers return plain domain errors.
func New(opts Options) *grpc.Server {
	lg := opts.Logger
	recoveryOpt := recovery.WithRecoveryHandlerContext(func(ctx context.Context, p any) error {
		lg.ErrorContext(ctx, "panic in handler", "panic", fmt.Sprint(p), "stack", string(debug.Stack()), "request_id", RequestID(ctx))
		return status.Error(codes.Internal, "internal error")
	})
	logOpts := []logging.Option{
		logging.WithLogOnEvents(logging.FinishCall),
		logging.WithFieldsFromContext(func(ctx context.Context) logging.Fields {
			return logging.Fields{"request_id", RequestID(ctx)}
		}),
	}
	logger := logging.LoggerFunc(func(ctx context.Context, level logging.Level, msg string, fields ...any) {
		lg.Log(ctx, slog.Level(level), msg, fields...)
	})
	// Built once, not per call. Reads (Get…, List…) are the hot calls
	// (every SSE connect, every console poll): their successes log at
	// Debug, so a connect storm does not write a line per connection.
	logUnary := logging.UnaryServerInterceptor(logger, logOpts...)
	logUnaryRead := logging.UnaryServerInterceptor(logger, append(logOpts, logging.WithLevels(readLevel))...)
	logStream := logging.StreamServerInterceptor(logger, logOpts...)
	skipHealthLog := func(method string) bool { return isHealth(method) }

	so := []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(
			recovery.UnaryServerInterceptor(recoveryOpt),
			unaryRequestID,
			func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
				switch {
				case skipHealthLog(info.FullMethod):
					return h(ctx, req)
				case isRead(info.FullMethod):
					return logUnaryRead(ctx, req, info, h)
				}
				return logUnary(ctx, req, info, h)
			},
			unaryAuth(opts),
			unaryErrors(lg),
		),
		grpc.ChainStreamInterceptor(
			recovery.StreamServerInterceptor(recoveryOpt),
			streamRequestID,
			func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
				if skipHealthLog(info.FullMethod) {
					return h(srv, ss)
				}
				return logStream(srv, ss, info, h)
			},
			streamAuth(opts),
			streamErrors(lg),
		),
	}
	// otelgrpc as a stats handler: server spans with W3C context from the
	// caller; health and reflection stay out of traces.
	so = append(so, grpc.StatsHandler(otelgrpc.NewServerHandler(otelgrpc.WithFilter(func(info *stats.RPCTagInfo) bool {
		return !isHealth(info.FullMethodName)
	}))))
	so = append(so, opts.ServerOptions...)
	s := grpc.NewServer(so...)
	if opts.Reflection {
		reflection.Register(s)
	}
	return s
}

// Subset returns desc with only the named RPCs (full method names such as
// taskrunnerv1.EventsService_Connect_FullMethodName). Registering a subset
// is how a port serves some RPCs of a service and not others: a call to a
// left-out RPC is Unimplemented, before any interceptor or handler runs.
// It panics on a name desc does not have, so a renamed RPC fails at start.
func Subset(desc *grpc.ServiceDesc, fullMethods ...string) *grpc.ServiceDesc {
	want := make(map[string]bool, len(fullMethods))
	for _, m := range fullMethods {
		want[m] = true
	}
	out := *desc
	out.Methods, out.Streams = nil, nil
	prefix := "/" + desc.ServiceName + "/"
	for _, m := range desc.Methods {
		if want[prefix+m.MethodName] {
			out.Methods = append(out.Methods, m)
			delete(want, prefix+m.MethodName)
		}
	}
	for _, st := range desc.Streams {
		if want[prefix+st.StreamName] {
			out.Streams = append(out.Streams, st)
			delete(want, prefix+st.StreamName)
		}
	}
	for m := range want {
		panic(fmt.Sprintf("rpcserver.Subset: %s has no method %s", desc.ServiceName, m))
	}
	return &out
}

// Without returns desc without the named RPCs (full method names).
func Without(desc *grpc.ServiceDesc, fullMethods ...string) *grpc.ServiceDesc {
	drop := make(map[string]bool, len(fullMethods))
	for _, m := range fullMethods {
		drop[m] = true
	}
	var keep []string
	prefix := "/" + desc.ServiceName + "/"
	for _, m := range desc.Methods {
		if !drop[prefix+m.MethodName] {
			keep = append(keep, prefix+m.MethodName)
		}
	}
	for _, st := range desc.Streams {
		if !drop[prefix+st.StreamName] {
			keep = append(keep, prefix+st.StreamName)
		}
	}
	return Subset(desc, keep...)
}

func requestIDFrom(ctx context.Context) string {
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		if v := md.Get(RequestIDHeader); len(v) > 0 && len(v[0]) <= 128 && v[0] != "" {
			return v[0]
		}
	}
	return newRequestID()
}

func unaryRequestID(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	id := requestIDFrom(ctx)
	_ = grpc.SetHeader(ctx, metadata.Pairs(RequestIDHeader, id))
	return h(context.WithValue(ctx, requestIDKey{}, id), req)
}

type wrappedStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (w *wrappedStream) Context() context.Context { return w.ctx }

func streamRequestID(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	id := requestIDFrom(ss.Context())
	_ = ss.SetHeader(metadata.Pairs(RequestIDHeader, id))
	return h(srv, &wrappedStream{ss, context.WithValue(ss.Context(), requestIDKey{}, id)})
}

func authenticate(ctx context.Context, opts Options, method string) (context.Context, error) {
	if isHealth(method) || opts.Anonymous[method] {
		return ctx, nil
	}
	if opts.Auth == nil {
		return ctx, status.Error(codes.Unauthenticated, "authentication is not configured")
	}
	md, _ := metadata.FromIncomingContext(ctx)
	vals := md.Get("authorization")
	if len(vals) == 0 {
		return ctx, status.Error(codes.Unauthenticated, "missing bearer token")
	}
	tok, ok := auth.BearerFromHeader(vals[0])
	if !ok {
		return ctx, status.Error(codes.Unauthenticated, "malformed authorization header: want \"Bearer <token>\"")
	}
	p, err := opts.Auth.Authenticate(ctx, tok)
	if err != nil {
		return ctx, err
	}
	return auth.WithPrincipal(ctx, p), nil
}

func unaryAuth(opts Options) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		ctx, err := authenticate(ctx, opts, info.FullMethod)
		if err != nil {
			return nil, mapError(ctx, opts.Logger, err)
		}
		return h(ctx, req)
	}
}

func streamAuth(opts Options) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		ctx, err := authenticate(ss.Context(), opts, info.FullMethod)
		if err != nil {
			return mapError(ctx, opts.Logger, err)
		}
		return h(srv, &wrappedStream{ss, ctx})
	}
}

func mapError(ctx context.Context, lg *slog.Logger, err error) error {
	if err == nil {
		return nil
	}
	st, ok := errs.ToStatus(err)
	switch {
	case ok:
	case st.Code() == codes.Unavailable: // a database outage: the client retries
		lg.WarnContext(ctx, "dependency unavailable", "error", err.Error(), "request_id", RequestID(ctx))
	default:
		lg.ErrorContext(ctx, "internal error", "error", err.Error(), "request_id", RequestID(ctx))
	}
	return st.Err()
}

func unaryErrors(lg *slog.Logger) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		resp, err := h(ctx, req)
		return resp, mapError(ctx, lg, err)
	}
}

func streamErrors(lg *slog.Logger) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		return mapError(ss.Context(), lg, h(srv, ss))
	}
}

// Health wraps the gRPC health server with a readiness loop.
type Health struct {
	*health.Server
	services []string
}

// NewHealth registers health on s for the named services; everything starts
// NOT_SERVING.
func NewHealth(s *grpc.Server, services []string) *Health {
	h := &Health{Server: health.NewServer(), services: services}
	healthpb.RegisterHealthServer(s, h.Server)
	h.Set(false)
	return h
}

// Set marks the server and every service SERVING or NOT_SERVING.
func (h *Health) Set(serving bool) {
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if serving {
		st = healthpb.HealthCheckResponse_SERVING
	}
	h.SetServingStatus("", st)
	for _, s := range h.services {
		h.SetServingStatus(s, st)
	}
}

// Watch probes check every interval and flips the status with its result
// until ctx ends. The first probe runs at once.
func (h *Health) Watch(ctx context.Context, lg *slog.Logger, interval time.Duration, check func(context.Context) error) {
	var last *bool
	for {
		cctx, cancel := context.WithTimeout(ctx, interval)
		err := check(cctx)
		cancel()
		ok := err == nil
		if last == nil || *last != ok {
			if ok {
				lg.Info("dependencies ready: serving")
			} else {
				lg.Warn("dependencies not ready: not serving", "error", err)
			}
			last = &ok
		}
		if ctx.Err() != nil {
			return
		}
		h.Set(ok)
		select {
		case <-ctx.Done():
			return
		case <-time.After(interval):
		}
	}
}
