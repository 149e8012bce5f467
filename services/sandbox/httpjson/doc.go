// Package httpjson is the one JSON-over-HTTP client of the sandbox
// providers that talk to a REST API without a client library of their own
// (BoxLite): it encodes the request, sets the headers, decodes the answer
// or turns a non-2xx answer into an *Error, and retries through
// github.com/cenkalti/backoff/v5 what is safe to retry (429 honouring
// Retry-After, and 502/503/504 or a failed connection for idempotent
// methods). It must not know any provider's paths or map errors to
// sandbox errors: each provider does that from Error.Status.
package httpjson
