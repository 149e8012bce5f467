// Package auth authenticates API callers by bearer token and serves
// TokenService, with which a caller lists and revokes its owner's tokens.
// Tokens are random, shown once at creation and stored only as SHA-256
// hashes in api_tokens (this package owns the table); a token maps to an
// owner and scopes (the Principal) and may expire. Authentication reads the
// table on every call, never a cache, so revocation is immediate. It must
// never log or return a token's text.
package auth
