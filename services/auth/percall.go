package auth

import "context"

// PerRPCToken sends an API token on every gRPC call, for services and the
// gateway calling internal RPCs with an internal-scope token. Use it with
// grpc.WithPerRPCCredentials.
type PerRPCToken string

// GetRequestMetadata implements credentials.PerRPCCredentials.
func (t PerRPCToken) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(t)}, nil
}

// RequireTransportSecurity implements credentials.PerRPCCredentials. It is
// false because the control plane's public port is plaintext on a private
// network today; switch it on together with TLS on that port.
func (PerRPCToken) RequireTransportSecurity() bool { return false }

// String keeps the token out of %v and logs.
func (PerRPCToken) String() string { return "[REDACTED]" }
