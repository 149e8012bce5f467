package testkit

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

func TestSSEReader(t *testing.T) {
	r := NewSSEReader(strings.NewReader("retry: 1000\n\n: ping\n\nid: 7\nevent: log\ndata: a\ndata: b\n\ndata: x\n\n"))
	var got []SSEMessage
	for {
		m, err := r.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, m)
	}
	want := []SSEMessage{{Retry: "1000"}, {Comment: "ping"}, {ID: "7", HasID: true, Event: "log", Data: "a\nb", HasData: true}, {Data: "x", HasData: true}}
	if len(got) != len(want) {
		t.Fatalf("got %+v", got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("%d: got %+v, want %+v", i, got[i], want[i])
		}
	}
	if _, err := NewSSEReader(strings.NewReader("data: cut")).Next(); err == nil {
		t.Error("a message cut off is an error")
	}
}

func TestServeConn(t *testing.T) {
	srv := grpc.NewServer()
	healthpb.RegisterHealthServer(srv, health.NewServer())
	conn := ServeConn(t, srv)
	resp, err := healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{})
	if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("%v %v", resp, err)
	}
}
