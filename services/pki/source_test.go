package pki

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestLoadKeyPairSources(t *testing.T) {
	ca := newTestCA(t, testTD)
	certPEM, keyPEM, err := ca.MintTaskCert("t1", time.Now().Add(time.Hour))
	require.NoError(t, err)
	dir := t.TempDir()
	certFile := writeFile(t, dir, "c.pem", certPEM)
	keyFile := writeFile(t, dir, "k.pem", keyPEM)

	env := map[string]string{
		"TR_TLS_CERT_PEM": string(certPEM),
		"TR_TLS_KEY_PEM":  string(keyPEM),
		"TR_TLS_CA_PEM":   string(ca.CertPEM()),
	}
	fromEnv := SourceFromEnv("TR_TLS", func(k string) string { return env[k] })
	require.Equal(t, Source{CertPEM: string(certPEM), KeyPEM: string(keyPEM), CAPEM: string(ca.CertPEM())}, fromEnv)

	tests := []struct {
		name    string
		src     Source
		wantErr string
	}{
		{name: "files", src: Source{CertFile: certFile, KeyFile: keyFile}},
		{name: "PEM from env", src: fromEnv},
		{name: "mixed", src: Source{CertFile: certFile, KeyPEM: string(keyPEM)}},
		{name: "both file and PEM", src: Source{CertFile: certFile, CertPEM: string(certPEM), KeyFile: keyFile}, wantErr: "both as a file and as PEM"},
		{name: "no key", src: Source{CertFile: certFile}, wantErr: "no key configured"},
		{name: "missing file", src: Source{CertFile: dir + "/nope", KeyFile: keyFile}, wantErr: "no such file"},
		{name: "key as cert", src: Source{CertPEM: string(keyPEM), KeyPEM: string(keyPEM)}, wantErr: "load key pair"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			kp, err := LoadKeyPair(tt.src)
			if tt.wantErr != "" {
				require.ErrorContains(t, err, tt.wantErr)
				require.NotContains(t, err.Error(), string(keyPEM[30:60]), "error leaks key material")
				return
			}
			require.NoError(t, err)
			id, err := TaskIDFromCert(kp.Leaf, testTD)
			require.NoError(t, err)
			require.Equal(t, "t1", id)
		})
	}

	pool, err := LoadCAPool(fromEnv)
	require.NoError(t, err)
	require.True(t, pool.Equal(ca.Pool()))

	// A Reloader works from PEM alone (a sandbox gets its material in the environment).
	r, err := NewReloaderFromSource(fromEnv, nil)
	require.NoError(t, err)
	c, err := r.GetClientCertificate(nil)
	require.NoError(t, err)
	require.Equal(t, parseLeaf(t, certPEM).Raw, c.Leaf.Raw)
}
