package testkit

import (
	"context"
	"net"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"
)

// Target is the address to dial a Bufnet with (through Dialer).
const Target = "passthrough:///bufnet"

// Bufnet is a gRPC server serving on an in-memory listener.
type Bufnet struct{ lis *bufconn.Listener }

// Serve serves srv in memory until the test ends (then it stops srv and
// waits for Serve to return).
func Serve(t testing.TB, srv *grpc.Server) *Bufnet {
	t.Helper()
	lis := bufconn.Listen(1 << 20)
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(lis) }()
	t.Cleanup(func() { srv.Stop(); <-done })
	return &Bufnet{lis: lis}
}

// Dialer makes a client dial the in-memory listener (dial Target).
func (b *Bufnet) Dialer() grpc.DialOption {
	return grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return b.lis.DialContext(ctx) })
}

// Conn is a plaintext client connection to the server, closed when the test
// ends (before the server stops).
func (b *Bufnet) Conn(t testing.TB, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	opts = append([]grpc.DialOption{b.Dialer(), grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)
	conn, err := grpc.NewClient(Target, opts...)
	if err != nil {
		t.Fatalf("bufconn client: %v", err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// ServeConn is Serve and Conn in one step.
func ServeConn(t testing.TB, srv *grpc.Server, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	return Serve(t, srv).Conn(t, opts...)
}
