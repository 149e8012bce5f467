package httpjson

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/cenkalti/backoff/v5"
)

// maxBody bounds what is read of an answer.
const maxBody = 8 << 20

// Client calls one JSON API.
type Client struct {
	// Base is the API's URL without a trailing slash (http://host:8100).
	Base string
	// HTTP does the requests. Nil: http.DefaultClient.
	HTTP *http.Client
	// BearerToken, when set, is sent as Authorization: Bearer.
	BearerToken string
	// ErrorMessage extracts the type and message of an error answer from
	// its body (the API's error envelope). Nil or an empty message: the
	// body's text is the message.
	ErrorMessage func(body []byte) (typ, msg string)
	// MaxTries bounds the attempts of one call, the first included.
	// Zero: 4.
	MaxTries uint
	// BackOff returns the wait between attempts when the server does not
	// say (Retry-After). Nil: exponential from 200 ms, at most 5 s.
	BackOff func() backoff.BackOff
}

// Error is a non-2xx answer.
type Error struct {
	Method, Path string
	Status       int
	Type         string
	Message      string
}

func (e *Error) Error() string {
	if e.Type != "" {
		return fmt.Sprintf("%s %s: HTTP %d %s: %s", e.Method, e.Path, e.Status, e.Type, e.Message)
	}
	return fmt.Sprintf("%s %s: HTTP %d: %s", e.Method, e.Path, e.Status, e.Message)
}

// IsStatus reports whether err is an answer with status code.
func IsStatus(err error, code int) bool {
	var e *Error
	return errors.As(err, &e) && e.Status == code
}

// Do sends in (when not nil) as JSON to Base+path?q and decodes the answer
// into out (when not nil and the answer has a body).
func (c *Client) Do(ctx context.Context, method, path string, q url.Values, in, out any) error {
	var body []byte
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("%s %s: encode: %w", method, path, err)
		}
		body = b
	}
	u := c.Base + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	bo := c.BackOff
	if bo == nil {
		bo = func() backoff.BackOff {
			b := backoff.NewExponentialBackOff()
			b.InitialInterval, b.MaxInterval = 200*time.Millisecond, 5*time.Second
			return b
		}
	}
	tries := c.MaxTries
	if tries == 0 {
		tries = 4
	}
	raw, err := backoff.Retry(ctx, func() ([]byte, error) {
		return c.once(ctx, method, path, u, body)
	}, backoff.WithBackOff(bo()), backoff.WithMaxTries(tries), backoff.WithMaxElapsedTime(0))
	if err != nil {
		return err
	}
	if out != nil && len(raw) > 0 {
		if err := json.Unmarshal(raw, out); err != nil {
			return fmt.Errorf("%s %s: decode: %w", method, path, err)
		}
	}
	return nil
}

// once makes one attempt. Its error is permanent unless another attempt
// may succeed and cannot do harm.
func (c *Client) once(ctx context.Context, method, path, u string, body []byte) ([]byte, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return nil, backoff.Permanent(err)
	}
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.BearerToken != "" {
		req.Header.Set("Authorization", "Bearer "+c.BearerToken)
	}
	hc := c.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	resp, err := hc.Do(req)
	if err != nil {
		err = fmt.Errorf("%s %s: %w", method, path, err)
		if ctx.Err() != nil || !idempotent(method) {
			// A POST may have reached the server: only the caller
			// knows whether repeating it is safe.
			return nil, backoff.Permanent(err)
		}
		return nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		return nil, backoff.Permanent(fmt.Errorf("%s %s: read: %w", method, path, err))
	}
	if resp.StatusCode < 300 {
		return raw, nil
	}
	e := &Error{Method: method, Path: path, Status: resp.StatusCode, Message: strings.TrimSpace(string(raw))}
	if c.ErrorMessage != nil {
		if typ, msg := c.ErrorMessage(raw); msg != "" {
			e.Type, e.Message = typ, msg
		}
	}
	switch {
	case resp.StatusCode == http.StatusTooManyRequests:
		// Refused before any work was done: safe for every method.
		if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s >= 0 {
			return nil, fmt.Errorf("%w (%w)", e, backoff.RetryAfter(s))
		}
		return nil, e
	case idempotent(method) && (resp.StatusCode == http.StatusBadGateway ||
		resp.StatusCode == http.StatusServiceUnavailable || resp.StatusCode == http.StatusGatewayTimeout):
		return nil, e
	default:
		return nil, backoff.Permanent(e)
	}
}

func idempotent(method string) bool {
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodPut, http.MethodDelete, http.MethodOptions:
		return true
	}
	return false
}
