// Package rpcauth holds the client side of taskrunner's gRPC bearer-token
// authentication, for every process that calls the control plane with an API
// token (taskrunnerd's internal clients, the gateway's webhook). The server
// side, which checks tokens against the database, is services/auth.
package rpcauth

import "context"

// BearerToken sends an API token on every gRPC call, for services and the
// gateway calling internal RPCs with an internal-scope token. Use it with
// grpc.WithPerRPCCredentials.
type BearerToken string

// GetRequestMetadata implements credentials.PerRPCCredentials.
func (t BearerToken) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(t)}, nil
}

// RequireTransportSecurity implements credentials.PerRPCCredentials. It is
// false because the control plane's public port is plaintext on a private
// network today; switch it on together with TLS on that port.
func (BearerToken) RequireTransportSecurity() bool { return false }

// String keeps the token out of %v and logs.
func (BearerToken) String() string { return "[REDACTED]" }
