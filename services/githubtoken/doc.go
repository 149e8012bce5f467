// Package githubtoken implements GitHubTokenService: it hands a runner a short-lived GitHub
// token for its own task's repository only (ARCHITECTURE.md section 5). In App mode it signs an
// RS256 app JWT, finds the installation of owner/repo and mints an installation token
// restricted to that one repository (contents: write, pull_requests: write, metadata: read),
// cached encrypted in Redis per (installation, repository) until shortly before expiry; in
// personal-token mode it hands out one configured token (local use only).
//
// It must never log a token, put one in a Redis key or return one in an error: GitHub client
// errors are rebuilt from their status code and a redacted message before they leave the
// package. It must not trust a task id from the request: the task comes from the verified
// runner certificate.
package githubtoken
