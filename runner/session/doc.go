// Package session packs an agent's conversation (Claude Code's transcript, Codex's thread
// rollout) into the archive the runner saves at the end of a run, and unpacks it into the next
// run's sandbox: a gzip-compressed tar with a manifest (agent, session id, usage baseline, the
// checkout path the files mention) and the agent's files, redacted, at most MaxBytes. It knows
// nothing of where the files live (the agent adapters say) nor of the Events service (the
// caller saves and loads the bytes); it must never write outside the paths the adapter names.
package session
