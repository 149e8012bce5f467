package rest

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/taskrunner/taskrunner/gateway/httperr"
)

// CORS lets browser pages from other origins call the API and open SSE
// streams. It is off unless Origins is set.
//
// Credentials policy: the API authenticates with a bearer token that the
// page sends itself (the Authorization header, or access_token for an
// EventSource), never with cookies, so the gateway never answers
// Access-Control-Allow-Credentials: a page must not be able to ride on a
// browser's ambient credentials. Authorization is allowed as a request
// header, which needs no credentials mode.
type CORS struct {
	// Origins allowed to call the API ("https://app.example.com", scheme,
	// host and port only), comma-separated; "*" allows any origin. Empty:
	// CORS is off and the gateway sends no CORS headers.
	Origins []string `env:"TASKRUNNER_CORS_ORIGINS" envSeparator:","`
	// MaxAge is how long a browser may cache a preflight answer.
	MaxAge time.Duration `env:"TASKRUNNER_CORS_MAX_AGE" envDefault:"10m"`
}

// What a cross-origin page may send and read.
var (
	corsMethods = []string{http.MethodGet, http.MethodHead, http.MethodPost}
	// Last-Event-ID: EventSource sends it when it reconnects.
	corsRequestHeaders = []string{"Authorization", "Content-Type", "Idempotency-Key", "Last-Event-ID", RequestIDHeader}
	// Headers beyond the CORS-safelisted ones that clients need.
	corsExposedHeaders = []string{RequestIDHeader, "Retry-After", "WWW-Authenticate", "Allow"}
)

// Validate checks that every origin is "*" or a bare origin.
func (c CORS) Validate() error {
	if c.MaxAge < 0 {
		return errors.New("TASKRUNNER_CORS_MAX_AGE: must not be negative")
	}
	for _, o := range c.Origins {
		o = strings.TrimSpace(o)
		if o == "*" {
			continue
		}
		u, err := url.Parse(o)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.Path != "" || u.RawQuery != "" || u.Fragment != "" || u.User != nil {
			return fmt.Errorf("TASKRUNNER_CORS_ORIGINS: %q is not an origin (want scheme://host[:port], or *)", o)
		}
	}
	return nil
}

// allowOrigin is the Access-Control-Allow-Origin value for origin, or "".
func (c CORS) allowOrigin(origin string) string {
	for _, o := range c.Origins {
		switch o = strings.TrimSpace(o); {
		case o == "*":
			return "*"
		case strings.EqualFold(strings.TrimSuffix(o, "/"), origin):
			return origin
		}
	}
	return ""
}

// handler wraps next with CORS: preflights are answered here, before
// routing, and every answer to an allowed origin carries its headers
// (errors included, so a page can read why a call failed).
func (c CORS) handler(next http.Handler) http.Handler {
	if len(c.Origins) == 0 {
		return next
	}
	maxAge := strconv.Itoa(int(c.MaxAge / time.Second))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		origin := r.Header.Get("Origin")
		if origin == "" {
			next.ServeHTTP(w, r)
			return
		}
		h := w.Header()
		h.Add("Vary", "Origin")
		allowed := c.allowOrigin(origin)
		preflight := r.Method == http.MethodOptions && r.Header.Get("Access-Control-Request-Method") != ""
		if preflight {
			h.Add("Vary", "Access-Control-Request-Method")
			h.Add("Vary", "Access-Control-Request-Headers")
			method := r.Header.Get("Access-Control-Request-Method")
			switch {
			case allowed == "":
				httperr.Write(w, status.New(codes.PermissionDenied, "origin "+httperr.Quote(origin)+" is not allowed (TASKRUNNER_CORS_ORIGINS)"))
			case !slices.Contains(corsMethods, method):
				h.Set("Access-Control-Allow-Origin", allowed)
				httperr.Write(w, status.New(codes.PermissionDenied, "method "+httperr.Quote(method)+" is not allowed cross-origin"))
			default:
				h.Set("Access-Control-Allow-Origin", allowed)
				h.Set("Access-Control-Allow-Methods", strings.Join(corsMethods, ", "))
				h.Set("Access-Control-Allow-Headers", strings.Join(corsRequestHeaders, ", "))
				h.Set("Access-Control-Max-Age", maxAge)
				w.WriteHeader(http.StatusNoContent)
			}
			return
		}
		if allowed != "" {
			h.Set("Access-Control-Allow-Origin", allowed)
			h.Set("Access-Control-Expose-Headers", strings.Join(corsExposedHeaders, ", "))
		}
		next.ServeHTTP(w, r)
	})
}
