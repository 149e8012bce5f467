package pki

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// identity is what the test server's interceptor saw for one call.
type identity struct {
	taskID string
	err    error
}

type testServer struct {
	addr string
	seen chan identity
}

// startServer serves the gRPC health service over real TLS on loopback, with the server side of
// ServerTLSConfig(r). Every call records TaskIDFromContext's answer in seen.
func startServer(t *testing.T, r *Reloader) *testServer {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ts := &testServer{addr: lis.Addr().String(), seen: make(chan identity, 16)}
	srv := grpc.NewServer(
		grpc.Creds(credentials.NewTLS(ServerTLSConfig(r))),
		grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			id, err := TaskIDFromContext(ctx, testTD)
			ts.seen <- identity{taskID: id, err: err}
			return h(ctx, req)
		}),
	)
	healthpb.RegisterHealthServer(srv, health.NewServer())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(lis)
	}()
	t.Cleanup(func() {
		srv.Stop()
		<-done
	})
	return ts
}

// check makes one health call on a fresh connection (so a fresh handshake) and returns the
// server certificate the client saw.
func check(t *testing.T, addr string, cfg *tls.Config) (*x509.Certificate, error) {
	t.Helper()
	conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	require.NoError(t, err)
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var p peer.Peer
	_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Peer(&p), grpc.WaitForReady(false))
	if err != nil {
		return nil, err
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	require.True(t, ok)
	require.Equal(t, uint16(tls.VersionTLS13), info.State.Version)
	return info.State.PeerCertificates[0], nil
}

// handshakeError dials addr with plain TLS and returns why the handshake failed: the client's own
// error, or the alert the server sends after a TLS 1.3 client has finished its side.
func handshakeError(t *testing.T, addr string, cfg *tls.Config) error {
	t.Helper()
	d := &tls.Dialer{Config: cfg}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(10*time.Second)))
	_, err = conn.Read(make([]byte, 1))
	return err
}

// writeFile writes PEM material into dir and returns its path.
func writeFile(t *testing.T, dir, name string, data []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	require.NoError(t, os.WriteFile(p, data, 0o600))
	return p
}

// serverReloader writes a server certificate for localhost/127.0.0.1 signed by ca, and ca itself as
// the client CA, and returns a Reloader over them.
func serverReloader(t *testing.T, ca *CA, opts ...ReloaderOption) (*Reloader, string) {
	t.Helper()
	dir := t.TempDir()
	certPEM, keyPEM, err := ca.MintServerCert([]string{"localhost", "127.0.0.1"}, time.Hour)
	require.NoError(t, err)
	r, err := NewReloader(
		writeFile(t, dir, "server.pem", certPEM),
		writeFile(t, dir, "server-key.pem", keyPEM),
		writeFile(t, dir, "ca.pem", ca.CertPEM()),
		nil, opts...)
	require.NoError(t, err)
	return r, dir
}

// runnerConfig is what a runner with a task certificate from issuer builds, trusting serverCA.
func runnerConfig(t *testing.T, issuer, serverCA *CA, taskID string, notAfter time.Time) *tls.Config {
	t.Helper()
	dir := t.TempDir()
	certPEM, keyPEM, err := issuer.MintTaskCert(taskID, notAfter)
	require.NoError(t, err)
	r, err := NewReloader(
		writeFile(t, dir, "task.pem", certPEM),
		writeFile(t, dir, "task-key.pem", keyPEM),
		writeFile(t, dir, "ca.pem", serverCA.CertPEM()),
		nil)
	require.NoError(t, err)
	return ClientTLSConfig(r, "127.0.0.1")
}

func TestMTLSHandshake(t *testing.T) {
	ca := newTestCA(t, testTD)
	otherCA := newTestCA(t, testTD)
	otherTD := newTestCA(t, "other.test")
	// otherTDUnderCA: a task cert for another trust domain, signed by the runner CA's key, which
	// the handshake accepts and TaskIDFromContext must reject.
	otherTDUnderCA := &CA{cert: ca.cert, certPEM: ca.certPEM, key: ca.key, trustDomain: "other.test"}
	r, _ := serverReloader(t, ca)
	srv := startServer(t, r)
	hour := time.Now().Add(time.Hour)

	bearerOnly := &tls.Config{RootCAs: ca.Pool(), ServerName: "localhost", MinVersion: tls.VersionTLS13}

	tests := []struct {
		name          string
		client        *tls.Config
		wantHandshake bool
		wantID        string
		wantIDErr     error
		wantReason    string // for a failed handshake
	}{
		{name: "task certificate", client: runnerConfig(t, ca, ca, "task-42", hour), wantHandshake: true, wantID: "task-42"},
		{name: "no client certificate", client: bearerOnly, wantHandshake: true, wantIDErr: ErrNoVerifiedCert},
		{name: "certificate from another CA", client: runnerConfig(t, otherCA, ca, "task-42", hour), wantReason: "unknown certificate authority"},
		{name: "certificate from another trust domain's CA", client: runnerConfig(t, otherTD, ca, "task-42", hour), wantReason: "unknown certificate authority"},
		{name: "expired certificate", client: runnerConfig(t, ca, ca, "task-42", time.Now().Add(-time.Second)), wantReason: "expired certificate"},
		{name: "wrong trust domain", client: runnerConfig(t, otherTDUnderCA, ca, "task-42", hour), wantHandshake: true, wantIDErr: ErrNotTaskIdentity},
		{name: "client does not trust the server's CA", client: runnerConfig(t, ca, otherCA, "task-42", hour), wantReason: "certificate signed by unknown authority"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			serverCert, err := check(t, srv.addr, tt.client)
			if !tt.wantHandshake {
				require.Error(t, err)
				require.Equal(t, codes.Unavailable, status.Code(err), "err: %v", err)
				require.Empty(t, srv.seen, "a call got through a failed handshake")
				// gRPC may report a broken pipe instead of the alert, depending on timing; a raw
				// TLS connection shows the reason reliably.
				require.ErrorContains(t, handshakeError(t, srv.addr, tt.client), tt.wantReason)
				return
			}
			require.NoError(t, err)
			require.Equal(t, "localhost", serverCert.Subject.CommonName)
			got := <-srv.seen
			if tt.wantIDErr != nil {
				require.ErrorIs(t, got.err, tt.wantIDErr)
				require.Empty(t, got.taskID)
				return
			}
			require.NoError(t, got.err)
			require.Equal(t, tt.wantID, got.taskID)
		})
	}
}

func TestServerRejectsTLS12(t *testing.T) {
	ca := newTestCA(t, testTD)
	r, _ := serverReloader(t, ca)
	srv := startServer(t, r)
	_, err := tls.Dial("tcp", srv.addr, &tls.Config{RootCAs: ca.Pool(), ServerName: "localhost", MaxVersion: tls.VersionTLS12})
	require.ErrorContains(t, err, "protocol version")
}

// fakeClock is a clock for the Reloader that moves only when told to; handshakes read it from
// server goroutines.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// syncBuffer is a log sink safe for the server's handshake goroutines.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// replace writes data to path and gives it a distinct modification time, so the change is
// visible even on file systems with coarse timestamps and when the size happens to be equal.
func replace(t *testing.T, path string, data []byte, mtime time.Time) {
	t.Helper()
	require.NoError(t, os.WriteFile(path, data, 0o600))
	require.NoError(t, os.Chtimes(path, mtime, mtime))
}

func TestReloadServerCertificate(t *testing.T) {
	ca := newTestCA(t, testTD)
	clk := &fakeClock{now: time.Unix(1_700_000_000, 0)}
	logs := &syncBuffer{}
	dir := t.TempDir()
	certA, keyA, err := ca.MintServerCert([]string{"localhost", "127.0.0.1"}, time.Hour)
	require.NoError(t, err)
	certFile := writeFile(t, dir, "server.pem", certA)
	keyFile := writeFile(t, dir, "server-key.pem", keyA)
	caFile := writeFile(t, dir, "ca.pem", ca.CertPEM())
	r, err := NewReloader(certFile, keyFile, caFile, slogTo(logs),
		WithClock(clk.Now), WithCheckInterval(time.Second))
	require.NoError(t, err)
	srv := startServer(t, r)
	client := runnerConfig(t, ca, ca, "t1", time.Now().Add(time.Hour))

	seen := func() []byte {
		t.Helper()
		c, err := check(t, srv.addr, client)
		require.NoError(t, err)
		<-srv.seen
		return c.Raw
	}
	require.Equal(t, parseLeaf(t, certA).Raw, seen())

	certB, keyB, err := ca.MintServerCert([]string{"localhost", "127.0.0.1"}, 2*time.Hour)
	require.NoError(t, err)
	mtime := time.Now().Add(time.Hour)
	replace(t, keyFile, keyB, mtime)
	replace(t, certFile, certB, mtime)

	// Within the check interval the files are not looked at.
	require.Equal(t, parseLeaf(t, certA).Raw, seen(), "reloaded before the check interval passed")

	clk.Advance(time.Second)
	require.Equal(t, parseLeaf(t, certB).Raw, seen(), "rotated certificate not picked up")
	require.Contains(t, logs.String(), "reloaded TLS files")

	// A broken rotation keeps the last good certificate and is logged, without key material.
	replace(t, certFile, []byte("not a certificate"), mtime.Add(time.Hour))
	clk.Advance(time.Second)
	require.Equal(t, parseLeaf(t, certB).Raw, seen(), "bad files replaced the good certificate")
	require.Contains(t, logs.String(), "reloading TLS files failed")
	require.NotContains(t, logs.String(), "PRIVATE KEY")
	require.NotContains(t, logs.String(), string(keyB[40:80]))

	// Fixing the file recovers without a restart; Reload forces the check.
	replace(t, certFile, certA, mtime.Add(2*time.Hour))
	replace(t, keyFile, keyA, mtime.Add(2*time.Hour))
	require.NoError(t, r.Reload())
	require.Equal(t, parseLeaf(t, certA).Raw, seen())
}

// TestReloadClientCA shows that the per-handshake config picks up a rotated runner CA.
func TestReloadClientCA(t *testing.T) {
	oldCA := newTestCA(t, testTD)
	newCA := newTestCA(t, testTD)
	clk := &fakeClock{now: time.Unix(1_700_000_000, 0)}
	r, dir := serverReloader(t, oldCA, WithClock(clk.Now), WithCheckInterval(time.Second))
	srv := startServer(t, r)
	hour := time.Now().Add(time.Hour)
	// The server certificate stays signed by oldCA, so runners keep trusting oldCA for it.
	withNewCert := runnerConfig(t, newCA, oldCA, "t-new", hour)

	_, err := check(t, srv.addr, withNewCert)
	require.Error(t, err, "certificate of a CA not yet trusted was accepted")

	replace(t, filepath.Join(dir, "ca.pem"), newCA.CertPEM(), time.Now().Add(time.Hour))
	clk.Advance(time.Second)
	_, err = check(t, srv.addr, withNewCert)
	require.NoError(t, err)
	got := <-srv.seen
	require.NoError(t, got.err)
	require.Equal(t, "t-new", got.taskID)

	_, err = check(t, srv.addr, runnerConfig(t, oldCA, oldCA, "t-old", hour))
	require.Error(t, err, "certificate of the retired CA was still accepted")
}

func TestNewReloaderErrors(t *testing.T) {
	ca := newTestCA(t, testTD)
	dir := t.TempDir()
	certPEM, keyPEM, err := ca.MintServerCert([]string{"localhost"}, time.Hour)
	require.NoError(t, err)
	_, otherKey, err := ca.MintServerCert([]string{"localhost"}, time.Hour)
	require.NoError(t, err)
	cert := writeFile(t, dir, "c.pem", certPEM)
	key := writeFile(t, dir, "k.pem", keyPEM)
	wrongKey := writeFile(t, dir, "k2.pem", otherKey)
	caFile := writeFile(t, dir, "ca.pem", ca.CertPEM())
	empty := writeFile(t, dir, "empty.pem", nil)

	tests := []struct {
		name          string
		cert, key, ca string
		wantErr       string
	}{
		{name: "missing cert", cert: filepath.Join(dir, "nope.pem"), key: key, ca: caFile, wantErr: "no such file"},
		{name: "mismatched key", cert: cert, key: wrongKey, ca: caFile, wantErr: "private key does not match"},
		{name: "empty CA", cert: cert, key: key, ca: empty, wantErr: "no PEM certificate"},
		{name: "no CA", cert: cert, key: key, ca: "", wantErr: "no CA bundle"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := NewReloader(tt.cert, tt.key, tt.ca, nil)
			require.ErrorContains(t, err, tt.wantErr)
		})
	}
}

func slogTo(w io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))
}
