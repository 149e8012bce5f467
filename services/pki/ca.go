package pki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"regexp"
	"strings"
	"time"
)

// clockSkew is how far NotBefore is backdated so that a certificate minted on one host is
// already valid on a host whose clock runs slightly behind.
const clockSkew = time.Minute

// maxTaskIDLen keeps the URI SAN (and the certificate) small; task ids are UUIDs or similar.
const maxTaskIDLen = 128

var (
	// ErrInvalidTaskID is returned for an empty or malformed task id.
	ErrInvalidTaskID = errors.New("pki: invalid task id")
	// ErrInvalidTrustDomain is returned for an empty or malformed trust domain.
	ErrInvalidTrustDomain = errors.New("pki: invalid trust domain")
)

var (
	taskIDPattern = regexp.MustCompile(`^[A-Za-z0-9._-]+$`)
	// SPIFFE trust domains are lowercase letters, digits, '.', '-' and '_'.
	trustDomainPattern = regexp.MustCompile(`^[a-z0-9._-]+$`)
)

// CA is the runner certificate authority. It signs per-task client certificates and server
// certificates. A CA is safe for concurrent use: it is immutable after construction.
type CA struct {
	cert        *x509.Certificate
	certPEM     []byte
	key         *ecdsa.PrivateKey
	trustDomain string
}

// NewCA creates a self-signed ECDSA P-256 CA for trustDomain, valid for validity from now.
// The trust domain is recorded in the CA certificate as the URI SAN spiffe://<trust-domain>
// so that LoadCA can recover it.
func NewCA(trustDomain string, validity time.Duration) (*CA, error) {
	if err := validateTrustDomain(trustDomain); err != nil {
		return nil, err
	}
	if validity <= 0 {
		return nil, fmt.Errorf("pki: CA validity must be positive, got %s", validity)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("pki: generate CA key: %w", err)
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{Organization: []string{"taskrunner"}, CommonName: "taskrunner runner CA " + trustDomain},
		NotBefore:             now.Add(-clockSkew),
		NotAfter:              now.Add(validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
		URIs:                  []*url.URL{{Scheme: "spiffe", Host: trustDomain}},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("pki: create CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("pki: parse CA certificate: %w", err)
	}
	return &CA{cert: cert, certPEM: encodeCert(der), key: key, trustDomain: trustDomain}, nil
}

// LoadCA loads a CA from PEM. The certificate must be a CA certificate carrying a
// spiffe://<trust-domain> URI SAN (as written by NewCA) and the key must match it.
func LoadCA(certPEM, keyPEM []byte) (*CA, error) {
	cert, err := parseSingleCert(certPEM)
	if err != nil {
		return nil, fmt.Errorf("pki: CA certificate: %w", err)
	}
	if !cert.IsCA || !cert.BasicConstraintsValid {
		return nil, errors.New("pki: CA certificate is not a CA")
	}
	key, err := parseECKey(keyPEM)
	if err != nil {
		return nil, fmt.Errorf("pki: CA key: %w", err)
	}
	pub, ok := cert.PublicKey.(*ecdsa.PublicKey)
	if !ok || !pub.Equal(&key.PublicKey) {
		return nil, errors.New("pki: CA key does not match CA certificate")
	}
	td, err := trustDomainOfCA(cert)
	if err != nil {
		return nil, err
	}
	return &CA{cert: cert, certPEM: encodeCert(cert.Raw), key: key, trustDomain: td}, nil
}

// LoadCAFiles is LoadCA reading the certificate and key from files.
func LoadCAFiles(certPath, keyPath string) (*CA, error) {
	certPEM, err := os.ReadFile(certPath)
	if err != nil {
		return nil, fmt.Errorf("pki: read CA certificate: %w", err)
	}
	keyPEM, err := os.ReadFile(keyPath)
	if err != nil {
		return nil, fmt.Errorf("pki: read CA key: %w", err)
	}
	return LoadCA(certPEM, keyPEM)
}

// CertPEM returns the PEM-encoded CA certificate (the trust bundle handed to runners).
func (ca *CA) CertPEM() []byte { return append([]byte(nil), ca.certPEM...) }

// KeyPEM returns the PEM-encoded PKCS#8 CA private key, for writing it to a 0600 file.
func (ca *CA) KeyPEM() ([]byte, error) { return encodeKey(ca.key) }

// Certificate returns the parsed CA certificate. Callers must not modify it.
func (ca *CA) Certificate() *x509.Certificate { return ca.cert }

// Pool returns a new certificate pool containing only this CA.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.cert)
	return p
}

// TrustDomain returns the SPIFFE trust domain of this CA.
func (ca *CA) TrustDomain() string { return ca.trustDomain }

// TaskURI returns the identity URI of a task in trustDomain: spiffe://<trust-domain>/task/<task-id>.
func TaskURI(trustDomain, taskID string) (*url.URL, error) {
	if err := validateTrustDomain(trustDomain); err != nil {
		return nil, err
	}
	if err := validateTaskID(taskID); err != nil {
		return nil, err
	}
	return &url.URL{Scheme: "spiffe", Host: trustDomain, Path: "/task/" + taskID}, nil
}

// MintTaskCert issues a client certificate for one task. Its only identity is the URI SAN
// spiffe://<trust-domain>/task/<task-id>; it is usable only for client authentication and
// expires at notAfter (the task deadline) or at the CA's expiry, whichever comes first.
// A notAfter in the past is not rejected: the certificate is simply already expired.
func (ca *CA) MintTaskCert(taskID string, notAfter time.Time) (certPEM, keyPEM []byte, err error) {
	u, err := TaskURI(ca.trustDomain, taskID)
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{Organization: []string{"taskrunner"}, CommonName: "task " + taskID},
		URIs:        []*url.URL{u},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	return ca.mint(tmpl, notAfter)
}

// MintServerCert issues a certificate for hosts (DNS names and IP addresses), valid for
// validity from now (capped at the CA's expiry). It carries both ServerAuth and ClientAuth so
// that a service can present it when it dials another service.
func (ca *CA) MintServerCert(hosts []string, validity time.Duration) (certPEM, keyPEM []byte, err error) {
	if len(hosts) == 0 {
		return nil, nil, errors.New("pki: server certificate needs at least one host")
	}
	if validity <= 0 {
		return nil, nil, fmt.Errorf("pki: server certificate validity must be positive, got %s", validity)
	}
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{Organization: []string{"taskrunner"}, CommonName: hosts[0]},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	for _, h := range hosts {
		h = strings.TrimSpace(h)
		switch {
		case h == "":
			return nil, nil, errors.New("pki: empty host in server certificate hosts")
		case net.ParseIP(h) != nil:
			tmpl.IPAddresses = append(tmpl.IPAddresses, net.ParseIP(h))
		default:
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	return ca.mint(tmpl, time.Now().Add(validity))
}

// mint fills in the fields common to every leaf and signs tmpl with a fresh P-256 key.
func (ca *CA) mint(tmpl *x509.Certificate, notAfter time.Time) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("pki: generate key: %w", err)
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, nil, err
	}
	tmpl.SerialNumber = serial
	tmpl.NotBefore = time.Now().Add(-clockSkew)
	tmpl.NotAfter = notAfter
	if tmpl.NotAfter.After(ca.cert.NotAfter) {
		tmpl.NotAfter = ca.cert.NotAfter
	}
	tmpl.BasicConstraintsValid = true
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return nil, nil, fmt.Errorf("pki: sign certificate: %w", err)
	}
	keyPEM, err = encodeKey(key)
	if err != nil {
		return nil, nil, err
	}
	return encodeCert(der), keyPEM, nil
}

func validateTaskID(id string) error {
	if id == "" || len(id) > maxTaskIDLen || !taskIDPattern.MatchString(id) || id == "." || id == ".." {
		return fmt.Errorf("%w: %q", ErrInvalidTaskID, id)
	}
	return nil
}

func validateTrustDomain(td string) error {
	if td == "" || len(td) > 255 || !trustDomainPattern.MatchString(td) {
		return fmt.Errorf("%w: %q", ErrInvalidTrustDomain, td)
	}
	return nil
}

func trustDomainOfCA(cert *x509.Certificate) (string, error) {
	if len(cert.URIs) != 1 {
		return "", fmt.Errorf("pki: CA certificate must have exactly one spiffe:// URI SAN, has %d", len(cert.URIs))
	}
	u := cert.URIs[0]
	if u.Scheme != "spiffe" || (u.Path != "" && u.Path != "/") || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return "", fmt.Errorf("pki: CA certificate URI SAN %q is not a trust domain", u.String())
	}
	if err := validateTrustDomain(u.Host); err != nil {
		return "", err
	}
	return u.Host, nil
}

// randomSerial returns a random positive 128-bit serial number.
func randomSerial() (*big.Int, error) {
	limit := new(big.Int).Lsh(big.NewInt(1), 128)
	for {
		n, err := rand.Int(rand.Reader, limit)
		if err != nil {
			return nil, fmt.Errorf("pki: generate serial: %w", err)
		}
		if n.Sign() > 0 {
			return n, nil
		}
	}
}

func encodeCert(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

func encodeKey(key *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("pki: marshal key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// parseSingleCert parses the first CERTIFICATE block of data.
func parseSingleCert(data []byte) (*x509.Certificate, error) {
	for {
		var block *pem.Block
		block, data = pem.Decode(data)
		if block == nil {
			return nil, errors.New("no CERTIFICATE PEM block")
		}
		if block.Type == "CERTIFICATE" {
			return x509.ParseCertificate(block.Bytes)
		}
	}
}

// parseECKey parses a PKCS#8 ("PRIVATE KEY") or SEC 1 ("EC PRIVATE KEY") ECDSA key. Parse
// errors are reported without any of the input, which is secret.
func parseECKey(data []byte) (*ecdsa.PrivateKey, error) {
	for {
		var block *pem.Block
		block, data = pem.Decode(data)
		if block == nil {
			return nil, errors.New("no PRIVATE KEY or EC PRIVATE KEY PEM block")
		}
		switch block.Type {
		case "PRIVATE KEY":
			k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
			if err != nil {
				return nil, errors.New("malformed PKCS#8 private key")
			}
			ec, ok := k.(*ecdsa.PrivateKey)
			if !ok {
				return nil, fmt.Errorf("private key is %T, want ECDSA", k)
			}
			return ec, nil
		case "EC PRIVATE KEY":
			k, err := x509.ParseECPrivateKey(block.Bytes)
			if err != nil {
				return nil, errors.New("malformed EC private key")
			}
			return k, nil
		}
	}
}
