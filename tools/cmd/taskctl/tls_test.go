package main

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/taskrunner/taskrunner/services/auth"
	"github.com/taskrunner/taskrunner/services/pki"
	"github.com/taskrunner/taskrunner/services/store/storetest"
)

// TestTLSToARealTaskrunnerd runs taskrunnerd with TLS on its public port and
// drives it with taskctl: --ca (or TASKRUNNER_GRPC_CA_FILE) works, plaintext
// and a CA that did not sign the server certificate do not.
func TestTLSToARealTaskrunnerd(t *testing.T) {
	db := storetest.NewDB(t)
	rd := storetest.NewRedis(t)
	dir := t.TempDir()
	bin := filepath.Join(dir, "taskrunnerd")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/taskrunner/taskrunner/services/cmd/taskrunnerd").CombinedOutput()
	require.NoError(t, err, string(out))
	paths, err := pki.InitDev(filepath.Join(dir, "pki"), "taskrunner.local", nil)
	require.NoError(t, err)
	other, err := pki.InitDev(filepath.Join(dir, "other"), "taskrunner.local", nil)
	require.NoError(t, err)

	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	cmd := exec.Command(bin, "--services=task")
	logs := &lockedBuffer{}
	cmd.Stdout, cmd.Stderr = logs, logs
	cmd.Env = append(os.Environ(), "TASKRUNNER_DATABASE_URL="+db.URL, "TASKRUNNER_REDIS_URL="+rd.URL, "TASKRUNNER_GRPC_ADDR="+addr,
		"TASKRUNNER_METRICS_ADDR=", "TASKRUNNER_RUNNER_GRPC_ADDR=",
		"TASKRUNNER_GRPC_TLS_CERT_FILE="+paths.ServerCert, "TASKRUNNER_GRPC_TLS_KEY_FILE="+paths.ServerKey)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	token, _, err := auth.NewStore(db.Pool).Create(context.Background(), "alice", nil, "")
	require.NoError(t, err)

	withCA := []string{"--addr", addr, "--token", token, "--ca", paths.CACert}
	require.Eventually(t, func() bool {
		_, err := taskctl(t, append(withCA, "task", "list")...)
		return err == nil
	}, 20*time.Second, 100*time.Millisecond, "taskrunnerd never answered over TLS: %s", logs)

	out2, err := taskctl(t, append(withCA, "task", "create", "--repo", "acme/widgets", "--prompt", "over TLS")...)
	require.NoError(t, err, out2)
	require.Regexp(t, `status:\s+proposing`, out2)

	t.Setenv("TASKRUNNER_GRPC_CA_FILE", paths.CACert)
	out2, err = taskctl(t, "--addr", addr, "--token", token, "task", "list")
	require.NoError(t, err, out2)
	require.Contains(t, out2, "acme/widgets")
	t.Setenv("TASKRUNNER_GRPC_CA_FILE", "")

	_, err = taskctl(t, "--addr", addr, "--token", token, "task", "list")
	require.ErrorContains(t, err, "Unavailable", "plaintext against a TLS port")
	_, err = taskctl(t, "--addr", addr, "--token", token, "--ca", other.CACert, "task", "list")
	require.ErrorContains(t, err, "certificate", "a CA that did not sign the server")
	_, err = taskctl(t, "--addr", addr, "--token", token, "--ca", filepath.Join(dir, "missing.pem"), "task", "list")
	require.ErrorContains(t, err, "--ca")
}

type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
