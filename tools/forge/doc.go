// Package forge is a local stand-in for GitHub that speaks GitHub's real wire protocols: a REST
// subset (app installations, installation access tokens, repositories, pull requests, signed
// pull_request webhooks) and git smart HTTP through `git http-backend`, with GitHub-like token
// checks. It exists for tests and the offline demo only and must never be used in production:
// it keeps its state in memory, trusts its admin endpoint without authentication and is not
// hardened against hostile clients.
package forge
