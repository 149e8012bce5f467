// Package redact removes secrets and terminal escape sequences from text the runner is about to
// send out of the sandbox (log tails, failure reasons, PR bodies). It knows the shapes of the
// secrets a task can meet (GitHub tokens, taskrunner API tokens, Anthropic/OpenAI keys, bearer
// values, PEM private keys), the exact text of secrets handed to the runner, and configured
// patterns. It must not log or keep anything but the secrets it was given.
package redact
