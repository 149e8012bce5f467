package pki

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/tls"
	"crypto/x509"
	"net"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
)

const testTD = "taskrunner.test"

func newTestCA(t *testing.T, td string) *CA {
	t.Helper()
	ca, err := NewCA(td, 24*time.Hour)
	require.NoError(t, err)
	return ca
}

func parseLeaf(t *testing.T, certPEM []byte) *x509.Certificate {
	t.Helper()
	c, err := parseSingleCert(certPEM)
	require.NoError(t, err)
	return c
}

func TestNewCA(t *testing.T) {
	tests := []struct {
		name        string
		trustDomain string
		validity    time.Duration
		wantErr     bool
		wantErrIs   error
	}{
		{name: "ok", trustDomain: testTD, validity: time.Hour},
		{name: "empty trust domain", trustDomain: "", validity: time.Hour, wantErr: true, wantErrIs: ErrInvalidTrustDomain},
		{name: "uppercase trust domain", trustDomain: "Example.org", validity: time.Hour, wantErr: true, wantErrIs: ErrInvalidTrustDomain},
		{name: "trust domain with path", trustDomain: "example.org/x", validity: time.Hour, wantErr: true, wantErrIs: ErrInvalidTrustDomain},
		{name: "zero validity", trustDomain: testTD, validity: 0, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ca, err := NewCA(tt.trustDomain, tt.validity)
			if tt.wantErr {
				require.Error(t, err)
				if tt.wantErrIs != nil {
					require.ErrorIs(t, err, tt.wantErrIs)
				}
				return
			}
			require.NoError(t, err)
			c := ca.Certificate()
			require.True(t, c.IsCA)
			require.Equal(t, x509.ECDSA, c.PublicKeyAlgorithm)
			require.Equal(t, elliptic.P256(), c.PublicKey.(*ecdsa.PublicKey).Curve)
			require.Equal(t, tt.trustDomain, ca.TrustDomain())
			require.WithinDuration(t, time.Now().Add(tt.validity), c.NotAfter, 5*time.Second)

			// Round trip through PEM keeps the trust domain and the key.
			keyPEM, err := ca.KeyPEM()
			require.NoError(t, err)
			loaded, err := LoadCA(ca.CertPEM(), keyPEM)
			require.NoError(t, err)
			require.Equal(t, tt.trustDomain, loaded.TrustDomain())
			require.Equal(t, c.Raw, loaded.Certificate().Raw)
			certPEM, _, err := loaded.MintTaskCert("t1", time.Now().Add(time.Hour))
			require.NoError(t, err)
			_, err = parseLeaf(t, certPEM).Verify(x509.VerifyOptions{
				Roots: ca.Pool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
			})
			require.NoError(t, err)
		})
	}
}

func TestLoadCARejects(t *testing.T) {
	ca := newTestCA(t, testTD)
	other := newTestCA(t, testTD)
	otherKey, err := other.KeyPEM()
	require.NoError(t, err)
	leafPEM, leafKey, err := ca.MintTaskCert("t1", time.Now().Add(time.Hour))
	require.NoError(t, err)

	tests := []struct {
		name            string
		certPEM, keyPEM []byte
		wantErr         string
	}{
		{name: "key of another CA", certPEM: ca.CertPEM(), keyPEM: otherKey, wantErr: "does not match"},
		{name: "leaf certificate", certPEM: leafPEM, keyPEM: leafKey, wantErr: "not a CA"},
		{name: "garbage certificate", certPEM: []byte("nope"), keyPEM: otherKey, wantErr: "no CERTIFICATE"},
		{name: "garbage key", certPEM: ca.CertPEM(), keyPEM: []byte("nope"), wantErr: "no PRIVATE KEY"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := LoadCA(tt.certPEM, tt.keyPEM)
			require.ErrorContains(t, err, tt.wantErr)
		})
	}
}

func TestMintTaskCert(t *testing.T) {
	ca, err := NewCA(testTD, 2*time.Hour)
	require.NoError(t, err)
	deadline := time.Now().Add(30 * time.Minute).Truncate(time.Second)

	tests := []struct {
		name         string
		taskID       string
		notAfter     time.Time
		wantNotAfter time.Time
		wantErr      bool
	}{
		{name: "uuid", taskID: "0b7c1f2e-5d3a-4c55-9a61-2f0e7f1d8c11", notAfter: deadline, wantNotAfter: deadline},
		{name: "dots and underscores", taskID: "task_1.retry-2", notAfter: deadline, wantNotAfter: deadline},
		{name: "deadline after CA expiry is clamped", taskID: "t1", notAfter: deadline.Add(24 * time.Hour), wantNotAfter: ca.Certificate().NotAfter},
		{name: "empty", taskID: "", notAfter: deadline, wantErr: true},
		{name: "slash", taskID: "a/b", notAfter: deadline, wantErr: true},
		{name: "dot dot", taskID: "..", notAfter: deadline, wantErr: true},
		{name: "space", taskID: "a b", notAfter: deadline, wantErr: true},
		{name: "percent escape", taskID: "a%2Fb", notAfter: deadline, wantErr: true},
		{name: "non-ascii", taskID: "tâche", notAfter: deadline, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			certPEM, keyPEM, err := ca.MintTaskCert(tt.taskID, tt.notAfter)
			if tt.wantErr {
				require.ErrorIs(t, err, ErrInvalidTaskID)
				require.Nil(t, certPEM)
				require.Nil(t, keyPEM)
				return
			}
			require.NoError(t, err)
			kp, err := tls.X509KeyPair(certPEM, keyPEM)
			require.NoError(t, err)
			c := kp.Leaf
			require.Equal(t, []*url.URL{{Scheme: "spiffe", Host: testTD, Path: "/task/" + tt.taskID}}, c.URIs)
			require.Equal(t, "spiffe://"+testTD+"/task/"+tt.taskID, c.URIs[0].String())
			require.Equal(t, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, c.ExtKeyUsage)
			require.False(t, c.IsCA)
			require.Empty(t, c.DNSNames)
			require.Equal(t, elliptic.P256(), c.PublicKey.(*ecdsa.PublicKey).Curve)
			require.WithinDuration(t, time.Now().Add(-time.Minute), c.NotBefore, 5*time.Second)
			require.True(t, c.NotAfter.Equal(tt.wantNotAfter.UTC().Truncate(time.Second)), "NotAfter %s, want %s", c.NotAfter, tt.wantNotAfter)
			require.Positive(t, c.SerialNumber.Sign())
			require.LessOrEqual(t, c.SerialNumber.BitLen(), 128)

			id, err := TaskIDFromCert(c, testTD)
			require.NoError(t, err)
			require.Equal(t, tt.taskID, id)
		})
	}

	t.Run("serials differ", func(t *testing.T) {
		a, _, err := ca.MintTaskCert("t1", deadline)
		require.NoError(t, err)
		b, _, err := ca.MintTaskCert("t1", deadline)
		require.NoError(t, err)
		require.NotEqual(t, parseLeaf(t, a).SerialNumber, parseLeaf(t, b).SerialNumber)
	})
}

func TestMintServerCert(t *testing.T) {
	ca := newTestCA(t, testTD)
	certPEM, keyPEM, err := ca.MintServerCert([]string{"events.internal", "localhost", "127.0.0.1", "::1"}, time.Hour)
	require.NoError(t, err)
	kp, err := tls.X509KeyPair(certPEM, keyPEM)
	require.NoError(t, err)
	c := kp.Leaf
	require.Equal(t, []string{"events.internal", "localhost"}, c.DNSNames)
	require.Len(t, c.IPAddresses, 2)
	require.True(t, c.IPAddresses[0].Equal(net.ParseIP("127.0.0.1")))
	require.True(t, c.IPAddresses[1].Equal(net.IPv6loopback))
	require.Empty(t, c.URIs)
	require.ElementsMatch(t, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}, c.ExtKeyUsage)
	require.WithinDuration(t, time.Now().Add(time.Hour), c.NotAfter, 5*time.Second)
	_, err = c.Verify(x509.VerifyOptions{DNSName: "events.internal", Roots: ca.Pool()})
	require.NoError(t, err)

	// A server certificate is not a task identity, even though it may be used as a client cert.
	_, err = TaskIDFromCert(c, testTD)
	require.ErrorIs(t, err, ErrNotTaskIdentity)

	for _, hosts := range [][]string{nil, {""}, {"localhost", " "}} {
		_, _, err := ca.MintServerCert(hosts, time.Hour)
		require.Error(t, err, "hosts %q", hosts)
	}
	_, _, err = ca.MintServerCert([]string{"localhost"}, 0)
	require.Error(t, err)
}

func TestTaskIDFromCert(t *testing.T) {
	mustURL := func(s string) *url.URL {
		u, err := url.Parse(s)
		require.NoError(t, err)
		return u
	}
	tests := []struct {
		name    string
		uris    []string
		wantID  string
		wantErr error
	}{
		{name: "task", uris: []string{"spiffe://taskrunner.test/task/abc-1"}, wantID: "abc-1"},
		{name: "no URI SAN", uris: nil, wantErr: ErrNotTaskIdentity},
		{name: "wrong trust domain", uris: []string{"spiffe://other.test/task/abc"}, wantErr: ErrNotTaskIdentity},
		{name: "wrong scheme", uris: []string{"https://taskrunner.test/task/abc"}, wantErr: ErrNotTaskIdentity},
		{name: "not a task path", uris: []string{"spiffe://taskrunner.test/service/events"}, wantErr: ErrNotTaskIdentity},
		{name: "nested path", uris: []string{"spiffe://taskrunner.test/task/abc/def"}, wantErr: ErrNotTaskIdentity},
		{name: "empty task id", uris: []string{"spiffe://taskrunner.test/task/"}, wantErr: ErrNotTaskIdentity},
		{name: "escaped slash", uris: []string{"spiffe://taskrunner.test/task/a%2Fb"}, wantErr: ErrNotTaskIdentity},
		{name: "query", uris: []string{"spiffe://taskrunner.test/task/abc?x=1"}, wantErr: ErrNotTaskIdentity},
		{name: "port", uris: []string{"spiffe://taskrunner.test:443/task/abc"}, wantErr: ErrNotTaskIdentity},
		{name: "userinfo", uris: []string{"spiffe://u@taskrunner.test/task/abc"}, wantErr: ErrNotTaskIdentity},
		{name: "two URI SANs", uris: []string{"spiffe://taskrunner.test/task/a", "spiffe://taskrunner.test/task/b"}, wantErr: ErrNotTaskIdentity},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := &x509.Certificate{}
			for _, s := range tt.uris {
				c.URIs = append(c.URIs, mustURL(s))
			}
			id, err := TaskIDFromCert(c, testTD)
			if tt.wantErr != nil {
				require.ErrorIs(t, err, tt.wantErr)
				require.Empty(t, id)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.wantID, id)
		})
	}
	_, err := TaskIDFromCert(nil, testTD)
	require.ErrorIs(t, err, ErrNoVerifiedCert)
}

// TestTaskIDFromContextNeedsVerifiedChain covers what a live server cannot show: a certificate
// that is only in PeerCertificates (presented, not verified) is not an identity.
func TestTaskIDFromContextNeedsVerifiedChain(t *testing.T) {
	ca := newTestCA(t, testTD)
	certPEM, _, err := ca.MintTaskCert("t1", time.Now().Add(time.Hour))
	require.NoError(t, err)
	leaf := parseLeaf(t, certPEM)

	tests := []struct {
		name    string
		ctx     context.Context
		wantID  string
		wantErr error
	}{
		{name: "no peer", ctx: context.Background(), wantErr: ErrNoVerifiedCert},
		{name: "not TLS", ctx: peer.NewContext(context.Background(), &peer.Peer{}), wantErr: ErrNoVerifiedCert},
		{
			name: "presented only",
			ctx: peer.NewContext(context.Background(), &peer.Peer{AuthInfo: credentials.TLSInfo{
				State: tls.ConnectionState{PeerCertificates: []*x509.Certificate{leaf}},
			}}),
			wantErr: ErrNoVerifiedCert,
		},
		{
			name: "verified",
			ctx: peer.NewContext(context.Background(), &peer.Peer{AuthInfo: credentials.TLSInfo{
				State: tls.ConnectionState{
					PeerCertificates: []*x509.Certificate{leaf},
					VerifiedChains:   [][]*x509.Certificate{{leaf, ca.Certificate()}},
				},
			}}),
			wantID: "t1",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id, err := TaskIDFromContext(tt.ctx, testTD)
			if tt.wantErr != nil {
				require.ErrorIs(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.wantID, id)
		})
	}
}
