package pki

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
)

// nextProtos is set on every config built here. gRPC needs "h2" (its clients enforce ALPN);
// "http/1.1" keeps the config usable by an HTTP server. It has to be set explicitly on the
// per-handshake config returned by GetConfigForClient, which does not inherit the NextProtos that
// grpc's credentials.NewTLS adds to its own copy of the outer config.
var nextProtos = []string{"h2", "http/1.1"}

// ServerTLSConfig returns a server config that presents r's certificate and asks for, but does
// not require, a client certificate, verified against r's CA pool when given. The same port
// serves runners (mTLS) and bearer-token clients (no certificate); runner-only RPCs check the
// peer with TaskIDFromContext, which accepts only a verified chain.
//
// The settings are built per handshake in GetConfigForClient so that a reloaded CA pool applies
// to new connections without a restart.
func ServerTLSConfig(r *Reloader) *tls.Config {
	return &tls.Config{
		MinVersion:     tls.VersionTLS13,
		NextProtos:     append([]string(nil), nextProtos...),
		GetCertificate: r.GetCertificate,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			return &tls.Config{
				MinVersion:     tls.VersionTLS13,
				NextProtos:     append([]string(nil), nextProtos...),
				GetCertificate: r.GetCertificate,
				ClientAuth:     tls.VerifyClientCertIfGiven,
				ClientCAs:      r.CAPool(),
				// A resumed session would carry a chain verified against an earlier CA pool;
				// gRPC connections are long-lived, so a full handshake each time costs little.
				SessionTicketsDisabled: true,
			}, nil
		},
	}
}

// ClientTLSConfig returns a client config for runners and service-to-service calls: it presents
// r's certificate and verifies the server against r's current CA pool and serverName. If
// serverName is empty, the name sent in SNI (grpc fills it from the dial target) is verified
// instead; dialing an IP address therefore needs an explicit serverName.
//
// Verification is done in VerifyConnection instead of by RootCAs so that a reloaded CA pool
// applies to new connections; InsecureSkipVerify only turns off the built-in check that this
// callback replaces.
func ClientTLSConfig(r *Reloader, serverName string) *tls.Config {
	return &tls.Config{
		MinVersion:           tls.VersionTLS13,
		NextProtos:           append([]string(nil), nextProtos...),
		ServerName:           serverName,
		GetClientCertificate: r.GetClientCertificate,
		InsecureSkipVerify:   true, //nolint:gosec // verified in VerifyConnection against the reloaded pool
		VerifyConnection: func(cs tls.ConnectionState) error {
			return verifyServer(cs, r.CAPool(), serverName)
		},
	}
}

func verifyServer(cs tls.ConnectionState, roots *x509.CertPool, serverName string) error {
	if len(cs.PeerCertificates) == 0 {
		return errors.New("pki: server presented no certificate")
	}
	name := serverName
	if name == "" {
		name = cs.ServerName
	}
	if name == "" {
		return errors.New("pki: no server name to verify the server certificate against")
	}
	inter := x509.NewCertPool()
	for _, c := range cs.PeerCertificates[1:] {
		inter.AddCert(c)
	}
	_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{
		DNSName:       name,
		Roots:         roots,
		Intermediates: inter,
		KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
	if err != nil {
		return fmt.Errorf("pki: verify server certificate: %w", err)
	}
	return nil
}
