package pki

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
)

// Source says where TLS material comes from: files (which a Reloader watches) or PEM text
// (typically from environment variables, as in a sandbox). For each of cert, key and CA, set
// either the file or the PEM, not both.
type Source struct {
	CertFile, KeyFile, CAFile string
	CertPEM, KeyPEM, CAPEM    string
}

// Environment variable suffixes read by SourceFromEnv.
const (
	EnvCertFile = "_CERT_FILE"
	EnvKeyFile  = "_KEY_FILE"
	EnvCAFile   = "_CA_FILE"
	EnvCertPEM  = "_CERT_PEM"
	EnvKeyPEM   = "_KEY_PEM"
	EnvCAPEM    = "_CA_PEM"
)

// SourceFromEnv builds a Source from prefix+EnvCertFile, prefix+EnvCertPEM and so on, e.g.
// TASKRUNNER_TLS_CERT_FILE. getenv is usually os.Getenv; it is a parameter so that callers
// keep reading configuration in one place and tests need no process environment.
func SourceFromEnv(prefix string, getenv func(string) string) Source {
	return Source{
		CertFile: getenv(prefix + EnvCertFile),
		KeyFile:  getenv(prefix + EnvKeyFile),
		CAFile:   getenv(prefix + EnvCAFile),
		CertPEM:  getenv(prefix + EnvCertPEM),
		KeyPEM:   getenv(prefix + EnvKeyPEM),
		CAPEM:    getenv(prefix + EnvCAPEM),
	}
}

// LoadKeyPair loads the certificate and key of src. The certificate may be followed by
// intermediates; the key must match the leaf.
func LoadKeyPair(src Source) (tls.Certificate, error) {
	certPEM, err := pick("certificate", src.CertFile, src.CertPEM)
	if err != nil {
		return tls.Certificate{}, err
	}
	keyPEM, err := pick("key", src.KeyFile, src.KeyPEM)
	if err != nil {
		return tls.Certificate{}, err
	}
	// tls.X509KeyPair's errors describe the PEM structure, never the key bytes.
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("pki: load key pair: %w", err)
	}
	return cert, nil
}

// LoadCAPool loads the CA bundle of src into a new pool.
func LoadCAPool(src Source) (*x509.CertPool, error) {
	caPEM, err := pick("CA bundle", src.CAFile, src.CAPEM)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, errors.New("pki: CA bundle holds no PEM certificate")
	}
	return pool, nil
}

func pick(what, file, pemText string) ([]byte, error) {
	switch {
	case file != "" && pemText != "":
		return nil, fmt.Errorf("pki: %s given both as a file and as PEM; set one", what)
	case file != "":
		b, err := os.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("pki: read %s: %w", what, err)
		}
		return b, nil
	case pemText != "":
		return []byte(pemText), nil
	default:
		return nil, fmt.Errorf("pki: no %s configured", what)
	}
}
