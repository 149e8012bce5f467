// Package auth authenticates API callers by bearer token. Tokens are random,
// shown once at creation and stored only as SHA-256 hashes in api_tokens; a
// token maps to an owner and scopes (the Principal). It must never log or
// return a token's text.
package auth
