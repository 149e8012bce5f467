// Package forge is a local stand-in for GitHub that speaks GitHub's real wire protocols: a REST
// subset (app installations, installation access tokens, repositories, pull requests, reviews,
// review and issue comments, collaborator permissions, and the signed webhooks for them) and
// git smart HTTP through `git http-backend`, with GitHub-like token checks. Every answer and
// webhook payload is built from go-github's types, so it has the real API's shape.
//
// It exists for tests and the offline demo only and must never be used in production: it keeps
// its state in memory, trusts its /_forge/ endpoints (creating repositories, setting
// collaborators, acting as any user) without authentication and is not hardened against hostile
// clients.
package forge
