// Package modelapi is a scripted stand-in for the Anthropic Messages API and the OpenAI
// Responses API: it answers POST /v1/messages and POST /v1/responses (streaming SSE or
// plain JSON) from a YAML script, so the real Claude Code CLI (ANTHROPIC_BASE_URL pointing
// at it) and the real Codex CLI (a model provider with base_url <server>/v1 and
// wire_api "responses") run real tools against a real workspace in tests and demos.
//
// It is for tests and the offline demo only and must never be used in production:
// it has no authentication, it ignores the model, max_tokens and every sampling
// setting, and it answers only what the script says. Each request is answered from
// the conversation it carries (the CLI resends the whole conversation every turn),
// so the server keeps no per-conversation state. That is also how it checks a resumed
// session: a stage with a `history` regexp (the demo's follow-up stages) answers its first
// request with an error unless the messages before the stage prompt match it, so a follow-up
// that did not resume the earlier conversation fails.
package modelapi
