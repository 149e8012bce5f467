package pki

import (
	"crypto/ecdsa"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"time"
)

// Development material lifetimes. The dev CA outlives many server certificates, which InitDev
// re-mints as they approach expiry.
const (
	DevCAValidity     = 5 * 365 * 24 * time.Hour
	DevServerValidity = 90 * 24 * time.Hour
	// devRenewBefore is how close to expiry a server certificate is re-minted.
	devRenewBefore = 24 * time.Hour
)

// DefaultDevHosts are the hosts of the development server certificate when none are given.
var DefaultDevHosts = []string{"localhost", "127.0.0.1", "::1"}

// Paths are the files written by InitDev.
type Paths struct {
	CACert     string // ca.pem
	CAKey      string // ca-key.pem, mode 0600
	ServerCert string // server.pem
	ServerKey  string // server-key.pem, mode 0600
}

// InitDev prepares development TLS material in dir: a CA for trustDomain (kept if it already
// exists; an existing CA of another trust domain is an error) and a server certificate for
// hosts (DefaultDevHosts if empty). The server certificate is re-minted only when it is missing,
// expires within 24 hours, was not signed by the CA, or does not cover every host. Files are
// replaced atomically, so a Reloader watching them never reads half a file.
func InitDev(dir, trustDomain string, hosts []string) (Paths, error) {
	if len(hosts) == 0 {
		hosts = DefaultDevHosts
	}
	p := Paths{
		CACert:     filepath.Join(dir, "ca.pem"),
		CAKey:      filepath.Join(dir, "ca-key.pem"),
		ServerCert: filepath.Join(dir, "server.pem"),
		ServerKey:  filepath.Join(dir, "server-key.pem"),
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return Paths{}, fmt.Errorf("pki: create %s: %w", dir, err)
	}
	ca, err := devCA(p, trustDomain)
	if err != nil {
		return Paths{}, err
	}
	if devServerCertValid(p, ca, hosts, time.Now()) {
		return p, nil
	}
	certPEM, keyPEM, err := ca.MintServerCert(hosts, DevServerValidity)
	if err != nil {
		return Paths{}, err
	}
	// Key first: a Reloader that sees the new key with the old certificate fails once and
	// retries when the certificate lands.
	if err := writeFileAtomic(p.ServerKey, keyPEM, 0o600); err != nil {
		return Paths{}, err
	}
	if err := writeFileAtomic(p.ServerCert, certPEM, 0o644); err != nil {
		return Paths{}, err
	}
	return p, nil
}

func devCA(p Paths, trustDomain string) (*CA, error) {
	certExists, err := exists(p.CACert)
	if err != nil {
		return nil, err
	}
	keyExists, err := exists(p.CAKey)
	if err != nil {
		return nil, err
	}
	switch {
	case certExists && keyExists:
		ca, err := LoadCAFiles(p.CACert, p.CAKey)
		if err != nil {
			return nil, err
		}
		if ca.TrustDomain() != trustDomain {
			return nil, fmt.Errorf("pki: existing CA %s is for trust domain %q, not %q; remove it to start over",
				p.CACert, ca.TrustDomain(), trustDomain)
		}
		return ca, nil
	case certExists || keyExists:
		// Never overwrite half of a CA: certificates signed by it may be in use.
		return nil, fmt.Errorf("pki: only one of %s and %s exists; remove it or restore the other", p.CACert, p.CAKey)
	}
	ca, err := NewCA(trustDomain, DevCAValidity)
	if err != nil {
		return nil, err
	}
	keyPEM, err := ca.KeyPEM()
	if err != nil {
		return nil, err
	}
	if err := writeFileAtomic(p.CAKey, keyPEM, 0o600); err != nil {
		return nil, err
	}
	if err := writeFileAtomic(p.CACert, ca.CertPEM(), 0o644); err != nil {
		return nil, err
	}
	return ca, nil
}

// devServerCertValid reports whether the existing server certificate can be kept.
func devServerCertValid(p Paths, ca *CA, hosts []string, now time.Time) bool {
	kp, err := LoadKeyPair(Source{CertFile: p.ServerCert, KeyFile: p.ServerKey})
	if err != nil {
		return false
	}
	leaf, err := x509.ParseCertificate(kp.Certificate[0])
	if err != nil || leaf.NotAfter.Before(now.Add(devRenewBefore)) {
		return false
	}
	if _, ok := kp.PrivateKey.(*ecdsa.PrivateKey); !ok {
		return false
	}
	if _, err := leaf.Verify(x509.VerifyOptions{
		Roots:       ca.Pool(),
		CurrentTime: now,
		KeyUsages:   []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}); err != nil {
		return false
	}
	for _, h := range hosts {
		if net.ParseIP(h) == nil && leaf.VerifyHostname(h) != nil {
			return false
		}
		if ip := net.ParseIP(h); ip != nil && !hasIP(leaf, ip) {
			return false
		}
	}
	return true
}

func hasIP(cert *x509.Certificate, ip net.IP) bool {
	for _, c := range cert.IPAddresses {
		if c.Equal(ip) {
			return true
		}
	}
	return false
}

func exists(path string) (bool, error) {
	_, err := os.Stat(path)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, fs.ErrNotExist):
		return false, nil
	default:
		return false, fmt.Errorf("pki: %w", err)
	}
}

// writeFileAtomic writes data to a temporary file in path's directory with perm and renames it
// over path.
func writeFileAtomic(path string, data []byte, perm os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("pki: write %s: %w", path, err)
	}
	tmp := f.Name()
	defer os.Remove(tmp) // no-op after a successful rename
	if err := f.Chmod(perm); err != nil {
		f.Close()
		return fmt.Errorf("pki: write %s: %w", path, err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("pki: write %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("pki: write %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("pki: write %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("pki: write %s: %w", path, err)
	}
	return nil
}
