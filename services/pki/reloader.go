package pki

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"
)

// DefaultCheckInterval is how often, at most, a Reloader stats its files.
const DefaultCheckInterval = time.Second

// Reloader holds a certificate, its key and a CA pool, and re-reads the files they come from
// when a file's modification time or size changes. It checks on use (in GetCertificate,
// GetClientCertificate and CAPool), at most once per check interval, so there is no goroutine
// to stop. A failed reload keeps the previous good material, logs the error and is retried
// when a file changes again (a rotation that writes the certificate before the key fails once
// and succeeds when the key lands).
//
// A Reloader is safe for concurrent use.
type Reloader struct {
	src      Source
	logger   *slog.Logger
	now      func() time.Time
	interval time.Duration

	mu        sync.Mutex
	cert      *tls.Certificate
	pool      *x509.CertPool
	stamps    [3]fileStamp // cert, key, CA files, as last attempted
	lastCheck time.Time
	statErr   bool // the last check could not stat a file; logged once until it can
}

type fileStamp struct {
	modTime int64 // UnixNano; plain integers compare reliably with ==
	size    int64
}

// ReloaderOption configures a Reloader.
type ReloaderOption func(*Reloader)

// WithClock sets the clock used to throttle checks (tests inject a fake one).
func WithClock(now func() time.Time) ReloaderOption { return func(r *Reloader) { r.now = now } }

// WithCheckInterval sets the minimum time between two checks of the files; zero checks on
// every use.
func WithCheckInterval(d time.Duration) ReloaderOption {
	return func(r *Reloader) { r.interval = d }
}

// NewReloader loads certFile, keyFile and caFile and returns a Reloader watching them. All three
// are required: the CA pool verifies the other side of every connection.
func NewReloader(certFile, keyFile, caFile string, logger *slog.Logger, opts ...ReloaderOption) (*Reloader, error) {
	return NewReloaderFromSource(Source{CertFile: certFile, KeyFile: keyFile, CAFile: caFile}, logger, opts...)
}

// NewReloaderFromSource is NewReloader for a Source; parts given as PEM never change, parts
// given as files are watched. Cert, key and CA are all required.
func NewReloaderFromSource(src Source, logger *slog.Logger, opts ...ReloaderOption) (*Reloader, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	r := &Reloader{src: src, logger: logger, now: time.Now, interval: DefaultCheckInterval}
	for _, o := range opts {
		o(r)
	}
	stamps, err := r.stat()
	if err != nil {
		return nil, err
	}
	cert, pool, err := r.load()
	if err != nil {
		return nil, err
	}
	r.cert, r.pool, r.stamps, r.lastCheck = cert, pool, stamps, r.now()
	return r, nil
}

// GetCertificate is a tls.Config.GetCertificate callback returning the current certificate.
func (r *Reloader) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	cert, _ := r.current()
	return cert, nil
}

// GetClientCertificate is a tls.Config.GetClientCertificate callback returning the current
// certificate.
func (r *Reloader) GetClientCertificate(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
	cert, _ := r.current()
	return cert, nil
}

// CAPool returns the current CA pool. Callers must not modify it.
func (r *Reloader) CAPool() *x509.CertPool {
	_, pool := r.current()
	return pool
}

// Reload re-reads the files now, regardless of the check interval and of whether they changed
// (for a SIGHUP handler). On error the previous material stays in use.
func (r *Reloader) Reload() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lastCheck = r.now()
	stamps, err := r.stat()
	if err == nil {
		err = r.apply(stamps)
	}
	return err
}

// current returns the material in use, first reloading it if the check interval has passed
// and a file changed.
func (r *Reloader) current() (*tls.Certificate, *x509.CertPool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if now := r.now(); now.Sub(r.lastCheck) >= r.interval {
		r.lastCheck = now
		r.maybeReload()
	}
	return r.cert, r.pool
}

// maybeReload reloads when a watched file's stamp differs from the last attempt. Called with mu
// held; stat-ing three files and parsing PEM is cheap enough to do under the lock, and it keeps
// concurrent handshakes from reloading the same files several times.
func (r *Reloader) maybeReload() {
	stamps, err := r.stat()
	if err != nil {
		// A file may be briefly missing during a rotation: log once, keep the stamps as they
		// were so that the next check retries.
		if !r.statErr {
			r.logger.Warn("pki: cannot stat TLS files; keeping current certificate", "error", err)
		}
		r.statErr = true
		return
	}
	r.statErr = false
	if stamps == r.stamps {
		return
	}
	_ = r.apply(stamps)
}

// apply loads the material and swaps it in, recording stamps as attempted either way. Called
// with mu held.
func (r *Reloader) apply(stamps [3]fileStamp) error {
	r.stamps = stamps
	cert, pool, err := r.load()
	if err != nil {
		r.logger.Error("pki: reloading TLS files failed; keeping previous certificate",
			"cert_file", r.src.CertFile, "key_file", r.src.KeyFile, "ca_file", r.src.CAFile, "error", err)
		return err
	}
	r.cert, r.pool = cert, pool
	r.logger.Info("pki: reloaded TLS files",
		"cert_file", r.src.CertFile, "ca_file", r.src.CAFile, "not_after", cert.Leaf.NotAfter)
	return nil
}

func (r *Reloader) load() (*tls.Certificate, *x509.CertPool, error) {
	cert, err := LoadKeyPair(r.src)
	if err != nil {
		return nil, nil, err
	}
	if cert.Leaf == nil {
		if cert.Leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return nil, nil, fmt.Errorf("pki: parse certificate: %w", err)
		}
	}
	pool, err := LoadCAPool(r.src)
	if err != nil {
		return nil, nil, err
	}
	return &cert, pool, nil
}

// stat returns the stamps of the watched files; parts given as PEM have a zero stamp.
func (r *Reloader) stat() ([3]fileStamp, error) {
	var out [3]fileStamp
	var errs []error
	for i, name := range []string{r.src.CertFile, r.src.KeyFile, r.src.CAFile} {
		if name == "" {
			continue
		}
		fi, err := os.Stat(name)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out[i] = fileStamp{modTime: fi.ModTime().UnixNano(), size: fi.Size()}
	}
	return out, errors.Join(errs...)
}
