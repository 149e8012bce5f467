// Package repotoken gets the short-lived repository token the runner clones, pushes and opens
// the pull request with: from GitHubTokenService.IssueRepoToken over mTLS (the task comes from
// the client certificate), cached and asked for again when it is about to expire. It must never
// log a token or put one in an error.
package repotoken
