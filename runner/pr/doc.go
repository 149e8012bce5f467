// Package pr opens the task's pull request with go-github against the forge named by the
// repository token (GitHub, GitHub Enterprise or the local forge), and writes its title and
// body from the OpenSpec change. It must not run git or read the token from anywhere but its
// argument, and its errors carry the API's status and message, never the token.
package pr
