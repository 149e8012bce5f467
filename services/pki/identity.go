package pki

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"strings"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
)

var (
	// ErrNoVerifiedCert means the peer did not present a client certificate that was verified
	// against the runner CA (no TLS, no certificate, or no verified chain). Callers map it to
	// codes.Unauthenticated.
	ErrNoVerifiedCert = errors.New("pki: no verified client certificate")
	// ErrNotTaskIdentity means a verified certificate does not name a task of this trust
	// domain. Callers map it to codes.PermissionDenied.
	ErrNotTaskIdentity = errors.New("pki: certificate is not a task identity")
)

// TaskIDFromCert returns the task id named by cert's URI SAN, which must be exactly
// spiffe://<trustDomain>/task/<task-id>. It does not verify the certificate's signature or
// validity: pass only certificates from a verified chain (TaskIDFromContext does).
func TaskIDFromCert(cert *x509.Certificate, trustDomain string) (string, error) {
	if cert == nil {
		return "", ErrNoVerifiedCert
	}
	// SPIFFE allows exactly one URI SAN; more would make the identity ambiguous.
	switch len(cert.URIs) {
	case 0:
		return "", fmt.Errorf("%w: no URI SAN", ErrNotTaskIdentity)
	case 1:
	default:
		return "", fmt.Errorf("%w: %d URI SANs, want 1", ErrNotTaskIdentity, len(cert.URIs))
	}
	u := cert.URIs[0]
	if u.Scheme != "spiffe" || u.User != nil || u.Port() != "" || u.RawQuery != "" || u.Fragment != "" || u.Opaque != "" {
		return "", fmt.Errorf("%w: URI SAN %q is not a SPIFFE id", ErrNotTaskIdentity, u.String())
	}
	if u.Host != trustDomain {
		return "", fmt.Errorf("%w: trust domain %q, want %q", ErrNotTaskIdentity, u.Host, trustDomain)
	}
	// RawPath is set only when the path holds escapes; a task id never needs one.
	id, ok := strings.CutPrefix(u.Path, "/task/")
	if !ok || u.RawPath != "" {
		return "", fmt.Errorf("%w: path %q, want /task/<task-id>", ErrNotTaskIdentity, u.Path)
	}
	if err := validateTaskID(id); err != nil {
		return "", fmt.Errorf("%w: %w", ErrNotTaskIdentity, err)
	}
	return id, nil
}

// TaskIDFromContext returns the task id of the gRPC peer in ctx. Only the leaf of a chain that
// the TLS stack verified against the runner CA counts: a certificate that was presented but not
// verified (State.PeerCertificates without State.VerifiedChains) yields ErrNoVerifiedCert.
func TaskIDFromContext(ctx context.Context, trustDomain string) (string, error) {
	p, ok := peer.FromContext(ctx)
	if !ok || p.AuthInfo == nil {
		return "", fmt.Errorf("%w: no peer information", ErrNoVerifiedCert)
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok {
		return "", fmt.Errorf("%w: connection is not TLS", ErrNoVerifiedCert)
	}
	chains := info.State.VerifiedChains
	if len(chains) == 0 || len(chains[0]) == 0 {
		return "", ErrNoVerifiedCert
	}
	return TaskIDFromCert(chains[0][0], trustDomain)
}
