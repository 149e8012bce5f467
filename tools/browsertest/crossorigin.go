package browsertest

import (
	_ "embed"
	"errors"
	"net"
	"net/http"
	"time"
)

//go:embed cors.html
var corsPage []byte

// CrossOrigin serves cors.html, a page that calls the API and opens an
// event stream from its own origin, on two loopback ports: Allowed is the
// origin to list in the gateway's TASKRUNNER_CORS_ORIGINS, Denied one that
// is not listed (its calls must fail). Each is an origin URL without a
// trailing slash.
type CrossOrigin struct {
	Allowed, Denied string
	servers         []*http.Server
}

// StartCrossOrigin starts both servers; Close stops them.
func StartCrossOrigin() (*CrossOrigin, error) {
	c := &CrossOrigin{}
	page := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		_, _ = w.Write(corsPage)
	})
	var errs []error
	for _, dst := range []*string{&c.Allowed, &c.Denied} {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			errs = append(errs, err)
			continue
		}
		srv := &http.Server{Handler: page, ReadHeaderTimeout: 10 * time.Second}
		c.servers = append(c.servers, srv)
		*dst = "http://" + lis.Addr().String()
		go func() { _ = srv.Serve(lis) }()
	}
	if err := errors.Join(errs...); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// Close stops the servers.
func (c *CrossOrigin) Close() {
	for _, s := range c.servers {
		_ = s.Close()
	}
}
