// Package codex drives the OpenAI Codex CLI (`codex exec --json`) through the OpenSpec stages,
// one invocation per stage, the later ones resuming the first stage's thread, with a per-task
// CODEX_HOME whose config.toml names the model provider, base URL and model. It parses the
// CLI's JSONL events line by line: commands and file changes become observations, messages and
// command output become log lines, turn.completed becomes token usage priced with a
// configurable price table (Codex reports no cost), turn.failed and error become the failure
// reason. Like the Claude adapter it must not redact, batch or send anything itself, and must
// not run the CLI as root when it can drop privileges.
package codex
