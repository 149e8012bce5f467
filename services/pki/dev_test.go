package pki

import (
	"crypto/x509"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return b
}

func TestInitDevCreates(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "tls")
	p, err := InitDev(dir, testTD, nil)
	require.NoError(t, err)
	require.Equal(t, Paths{
		CACert:     filepath.Join(dir, "ca.pem"),
		CAKey:      filepath.Join(dir, "ca-key.pem"),
		ServerCert: filepath.Join(dir, "server.pem"),
		ServerKey:  filepath.Join(dir, "server-key.pem"),
	}, p)

	for path, mode := range map[string]os.FileMode{p.CACert: 0o644, p.CAKey: 0o600, p.ServerCert: 0o644, p.ServerKey: 0o600} {
		fi, err := os.Stat(path)
		require.NoError(t, err)
		require.Equal(t, mode, fi.Mode().Perm(), path)
	}
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Len(t, entries, 4, "temporary files left behind")

	ca, err := LoadCAFiles(p.CACert, p.CAKey)
	require.NoError(t, err)
	require.Equal(t, testTD, ca.TrustDomain())
	kp, err := LoadKeyPair(Source{CertFile: p.ServerCert, KeyFile: p.ServerKey})
	require.NoError(t, err)
	require.Equal(t, []string{"localhost"}, kp.Leaf.DNSNames)
	require.Len(t, kp.Leaf.IPAddresses, 2)
	require.True(t, kp.Leaf.IPAddresses[0].Equal(net.ParseIP("127.0.0.1")))
	require.True(t, kp.Leaf.IPAddresses[1].Equal(net.IPv6loopback))
	for _, h := range DefaultDevHosts {
		_, err = kp.Leaf.Verify(x509.VerifyOptions{DNSName: h, Roots: ca.Pool()})
		require.NoError(t, err, h)
	}
}

func TestInitDevIdempotent(t *testing.T) {
	tests := []struct {
		name string
		// change alters the directory after a first InitDev; it receives the CA.
		change       func(t *testing.T, p Paths, ca *CA)
		hosts        []string
		wantReminted bool
	}{
		{name: "nothing changed", change: func(*testing.T, Paths, *CA) {}},
		{name: "server certificate missing", wantReminted: true, change: func(t *testing.T, p Paths, _ *CA) {
			require.NoError(t, os.Remove(p.ServerCert))
		}},
		{name: "server key missing", wantReminted: true, change: func(t *testing.T, p Paths, _ *CA) {
			require.NoError(t, os.Remove(p.ServerKey))
		}},
		{name: "server certificate expires within 24h", wantReminted: true, change: func(t *testing.T, p Paths, ca *CA) {
			certPEM, keyPEM, err := ca.MintServerCert(DefaultDevHosts, 23*time.Hour)
			require.NoError(t, err)
			require.NoError(t, os.WriteFile(p.ServerCert, certPEM, 0o644))
			require.NoError(t, os.WriteFile(p.ServerKey, keyPEM, 0o600))
		}},
		{name: "server certificate expires in 25h", change: func(t *testing.T, p Paths, ca *CA) {
			certPEM, keyPEM, err := ca.MintServerCert(DefaultDevHosts, 25*time.Hour)
			require.NoError(t, err)
			require.NoError(t, os.WriteFile(p.ServerCert, certPEM, 0o644))
			require.NoError(t, os.WriteFile(p.ServerKey, keyPEM, 0o600))
		}},
		{name: "server certificate from another CA", wantReminted: true, change: func(t *testing.T, p Paths, _ *CA) {
			other := newTestCA(t, testTD)
			certPEM, keyPEM, err := other.MintServerCert(DefaultDevHosts, 48*time.Hour)
			require.NoError(t, err)
			require.NoError(t, os.WriteFile(p.ServerCert, certPEM, 0o644))
			require.NoError(t, os.WriteFile(p.ServerKey, keyPEM, 0o600))
		}},
		{name: "new host requested", hosts: []string{"localhost", "127.0.0.1", "::1", "events"}, wantReminted: true,
			change: func(*testing.T, Paths, *CA) {}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			p, err := InitDev(dir, testTD, nil)
			require.NoError(t, err)
			caCert, caKey := readFile(t, p.CACert), readFile(t, p.CAKey)
			ca, err := LoadCA(caCert, caKey)
			require.NoError(t, err)
			tt.change(t, p, ca)
			before, _ := os.ReadFile(p.ServerCert)

			p2, err := InitDev(dir, testTD, tt.hosts)
			require.NoError(t, err)
			require.Equal(t, p, p2)
			require.Equal(t, caCert, readFile(t, p.CACert), "CA certificate replaced")
			require.Equal(t, caKey, readFile(t, p.CAKey), "CA key replaced")
			after := readFile(t, p.ServerCert)
			if !tt.wantReminted {
				require.Equal(t, before, after, "server certificate re-minted")
				return
			}
			require.NotEqual(t, before, after, "server certificate not re-minted")
			kp, err := LoadKeyPair(Source{CertFile: p.ServerCert, KeyFile: p.ServerKey})
			require.NoError(t, err)
			require.True(t, kp.Leaf.NotAfter.After(time.Now().Add(DevServerValidity-time.Hour)))
			_, err = kp.Leaf.Verify(x509.VerifyOptions{DNSName: "localhost", Roots: ca.Pool()})
			require.NoError(t, err)
			for _, h := range tt.hosts {
				require.NoError(t, kp.Leaf.VerifyHostname(h), h)
			}
		})
	}
}

func TestInitDevRefusesToOverwriteCA(t *testing.T) {
	t.Run("other trust domain", func(t *testing.T) {
		dir := t.TempDir()
		_, err := InitDev(dir, testTD, nil)
		require.NoError(t, err)
		_, err = InitDev(dir, "other.test", nil)
		require.ErrorContains(t, err, `trust domain "taskrunner.test"`)
	})
	t.Run("half a CA", func(t *testing.T) {
		dir := t.TempDir()
		p, err := InitDev(dir, testTD, nil)
		require.NoError(t, err)
		caCert := readFile(t, p.CACert)
		require.NoError(t, os.Remove(p.CAKey))
		_, err = InitDev(dir, testTD, nil)
		require.ErrorContains(t, err, "only one of")
		require.Equal(t, caCert, readFile(t, p.CACert))
	})
}
