package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"io"
	"math/big"
	"net/url"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"

	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
	"github.com/taskrunner/taskrunner/services/auth"
	"github.com/taskrunner/taskrunner/services/pki"
	"github.com/taskrunner/taskrunner/services/store/storetest"
)

// daemon is a running taskrunnerd with both ports.
type daemon struct {
	public, runner string
	paths          pki.Paths
	token          string // alice's bearer token
	logs           *syncBuffer
}

// startDaemon runs taskrunnerd --services=task,events with the runner port
// (mTLS), TLS on the public port and reflection off there, and waits until
// the public port is SERVING.
func startDaemon(t *testing.T) *daemon {
	t.Helper()
	db := storetest.NewDB(t)
	rd := storetest.NewRedis(t)
	bin := buildDaemon(t)
	paths, err := pki.InitDev(t.TempDir(), "taskrunner.local", nil)
	require.NoError(t, err)
	d := &daemon{public: freeAddr(t), runner: freeAddr(t), paths: paths, logs: &syncBuffer{}}
	base := append(os.Environ(), "TASKRUNNER_DATABASE_URL="+db.URL, "TASKRUNNER_REDIS_URL="+rd.URL)
	migrate := exec.Command(bin, "migrate")
	migrate.Env = base
	out, err := migrate.CombinedOutput()
	require.NoError(t, err, string(out))

	cmd := exec.Command(bin, "--services=task,events")
	cmd.Stdout, cmd.Stderr = d.logs, d.logs
	cmd.Env = append(base, "TASKRUNNER_GRPC_ADDR="+d.public, "TASKRUNNER_RUNNER_GRPC_ADDR="+d.runner, "TASKRUNNER_METRICS_ADDR=",
		"TASKRUNNER_TLS_CERT_FILE="+paths.ServerCert, "TASKRUNNER_TLS_KEY_FILE="+paths.ServerKey, "TASKRUNNER_RUNNER_CA_FILE="+paths.CACert,
		"TASKRUNNER_GRPC_TLS_CERT_FILE="+paths.ServerCert, "TASKRUNNER_GRPC_TLS_KEY_FILE="+paths.ServerKey,
		"TASKRUNNER_GRPC_REFLECTION=false")
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })

	d.token, _, err = auth.NewStore(db.Pool).Create(context.Background(), "alice", nil, "")
	require.NoError(t, err)
	conn := d.dial(t, d.public, nil)
	hc := healthpb.NewHealthClient(conn)
	require.Eventually(t, func() bool {
		r, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{})
		return err == nil && r.GetStatus() == healthpb.HealthCheckResponse_SERVING
	}, 20*time.Second, 50*time.Millisecond, "never became SERVING: %s", d.logs)
	return d
}

// dial connects over TLS, verifying the server against the runner CA, and
// presenting cert when given.
func (d *daemon) dial(t *testing.T, addr string, cert *tls.Certificate) *grpc.ClientConn {
	t.Helper()
	caPEM, err := os.ReadFile(d.paths.CACert)
	require.NoError(t, err)
	roots := x509.NewCertPool()
	require.True(t, roots.AppendCertsFromPEM(caPEM))
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: roots, ServerName: "localhost"}
	if cert != nil {
		// Always present it: with Certificates, Go's client would leave out a
		// certificate whose issuer the server does not list.
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return cert, nil }
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

func (d *daemon) taskCert(t *testing.T, taskID string) *tls.Certificate {
	t.Helper()
	ca, err := pki.LoadCAFiles(d.paths.CACert, d.paths.CAKey)
	require.NoError(t, err)
	certPEM, keyPEM, err := ca.MintTaskCert(taskID, time.Now().Add(time.Hour))
	require.NoError(t, err)
	c, err := tls.X509KeyPair(certPEM, keyPEM)
	require.NoError(t, err)
	return &c
}

// selfSigned is a task certificate for the right trust domain that no CA
// of ours signed.
func selfSigned(t *testing.T, taskID string) *tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	u, err := url.Parse("spiffe://taskrunner.local/task/" + taskID)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "task " + taskID},
		URIs: []*url.URL{u}, NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	return &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

func requireCode(t *testing.T, err error, code codes.Code) {
	t.Helper()
	require.Error(t, err)
	require.Equal(t, code, status.Code(err), "%v", err)
}

// TestRunnerPortAdmitsOnlyRunnersAndOnlyRunnerRPCs: the runner port refuses
// a connection without a client certificate or with one our CA did not sign
// (in the TLS handshake, before any RPC), and with a valid task certificate
// serves health and the runner RPCs and nothing else: no public RPC (even
// with a valid bearer token), no other Events RPC, no reflection.
func TestRunnerPortAdmitsOnlyRunnersAndOnlyRunnerRPCs(t *testing.T) {
	d := startDaemon(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	taskID := uuid.NewString()

	for name, cert := range map[string]*tls.Certificate{"no certificate": nil, "self-signed": selfSigned(t, taskID)} {
		t.Run(name, func(t *testing.T) {
			conn := d.dial(t, d.runner, cert)
			_, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
			requireCode(t, err, codes.Unavailable)
			_, err = taskrunnerv1.NewTaskServiceClient(conn).ListTasks(withToken(ctx, d.token), &taskrunnerv1.ListTasksRequest{})
			requireCode(t, err, codes.Unavailable)
			// The handshake itself failed: no RPC reached the server.
			require.NotContains(t, d.logs.String(), taskrunnerv1.TaskService_ListTasks_FullMethodName)
		})
	}

	conn := d.dial(t, d.runner, d.taskCert(t, taskID))
	hc := healthpb.NewHealthClient(conn)
	require.Eventually(t, func() bool {
		r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: taskrunnerv1.EventsService_ServiceDesc.ServiceName})
		return err == nil && r.GetStatus() == healthpb.HealthCheckResponse_SERVING
	}, 20*time.Second, 50*time.Millisecond, "runner port never SERVING: %s", d.logs)
	_, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: taskrunnerv1.TaskService_ServiceDesc.ServiceName})
	requireCode(t, err, codes.NotFound) // health knows only the runner port's services

	_, err = taskrunnerv1.NewTaskServiceClient(conn).ListTasks(withToken(ctx, d.token), &taskrunnerv1.ListTasksRequest{})
	requireCode(t, err, codes.Unimplemented)
	_, err = taskrunnerv1.NewTokenServiceClient(conn).ListTokens(withToken(ctx, d.token), &taskrunnerv1.ListTokensRequest{})
	requireCode(t, err, codes.Unimplemented)
	ev := taskrunnerv1.NewEventsServiceClient(conn)
	_, err = ev.ListEvents(withToken(ctx, d.token), &taskrunnerv1.ListEventsRequest{TaskId: taskID})
	requireCode(t, err, codes.Unimplemented)
	sub, err := ev.Subscribe(withToken(ctx, d.token), &taskrunnerv1.SubscribeRequest{TaskId: taskID})
	require.NoError(t, err)
	_, err = sub.Recv()
	requireCode(t, err, codes.Unimplemented)
	requireNoReflection(t, ctx, conn)

	// Connect is served: the certificate's task is unknown, so the stream
	// is refused by Events itself, not as an unknown method.
	stream, err := ev.Connect(ctx)
	require.NoError(t, err)
	require.NoError(t, stream.Send(&taskrunnerv1.ConnectRequest{}))
	_, err = stream.Recv()
	require.Error(t, err)
	require.NotEqual(t, codes.Unimplemented, status.Code(err), "%v", err)
}

// TestPublicPortServesTLSWithoutRunnerRPCs: the public port speaks TLS when
// given a certificate (plaintext clients fail), reflection can be switched
// off, and the runner RPCs are not on it.
func TestPublicPortServesTLSWithoutRunnerRPCs(t *testing.T) {
	d := startDaemon(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn := d.dial(t, d.public, nil)

	resp, err := taskrunnerv1.NewTaskServiceClient(conn).CreateTask(withToken(ctx, d.token),
		&taskrunnerv1.CreateTaskRequest{Repo: "acme/widgets", Prompt: "over TLS"})
	require.NoError(t, err)
	require.Equal(t, "alice", resp.GetTask().GetOwner())
	toks, err := taskrunnerv1.NewTokenServiceClient(conn).ListTokens(withToken(ctx, d.token), &taskrunnerv1.ListTokensRequest{})
	require.NoError(t, err)
	require.Len(t, toks.GetTokens(), 1)
	requireNoReflection(t, ctx, conn)

	stream, err := taskrunnerv1.NewEventsServiceClient(conn).Connect(ctx)
	require.NoError(t, err)
	_, err = stream.Recv()
	requireCode(t, err, codes.Unimplemented)

	plain, err := grpc.NewClient(d.public, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer plain.Close()
	_, err = healthpb.NewHealthClient(plain).Check(ctx, &healthpb.HealthCheckRequest{})
	requireCode(t, err, codes.Unavailable)
}

func requireNoReflection(t *testing.T, ctx context.Context, conn *grpc.ClientConn) {
	t.Helper()
	rs, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(ctx)
	require.NoError(t, err)
	// Send may meet the server's end of the stream (io.EOF): the status
	// comes from Recv.
	if err := rs.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); !errors.Is(err, io.EOF) {
		require.NoError(t, err)
	}
	_, err = rs.Recv()
	requireCode(t, err, codes.Unimplemented)
}

func withToken(ctx context.Context, tok string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+tok)
}
