// Package redact removes secrets and terminal escape sequences from text before it leaves a
// process: the runner's log tails, failure reasons and PR bodies, the reasons stored on a task,
// the GitHub token service's error messages. It is the one set of secret shapes for every process
// (there were three, with drift) and the one rune-safe truncation. It knows the shapes of the
// secrets a task can meet (GitHub tokens, taskrunner API tokens, Anthropic/OpenAI keys, bearer
// values, JWTs, URL credentials, PEM private keys), the exact text of secrets handed to the runner, and configured
// patterns. It must not log or keep anything but the secrets it was given.
package redact
