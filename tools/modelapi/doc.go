// Package modelapi is a scripted stand-in for the Anthropic Messages API: it answers
// POST /v1/messages (streaming SSE or plain JSON) from a YAML script, so the real
// Claude Code CLI, started with ANTHROPIC_BASE_URL pointing at it, runs real tools
// (Read, Write, Edit, Bash) against a real workspace in tests and demos.
//
// It is for tests and the offline demo only and must never be used in production:
// it has no authentication, it ignores the model, max_tokens and every sampling
// setting, and it answers only what the script says. Each request is answered from
// the conversation it carries (the CLI resends the whole conversation every turn),
// so the server keeps no per-conversation state.
package modelapi
