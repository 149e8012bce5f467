package rpcauth

import (
	"context"
	"fmt"
	"testing"
)

func TestBearerToken(t *testing.T) {
	tok := BearerToken("trt_secret_value_123")
	md, err := tok.GetRequestMetadata(context.Background())
	if err != nil || md["authorization"] != "Bearer trt_secret_value_123" {
		t.Fatalf("metadata %v, %v", md, err)
	}
	if s := fmt.Sprintf("%v %s", tok, tok); s != "[REDACTED] [REDACTED]" {
		t.Fatalf("the token is printable: %q", s)
	}
}
