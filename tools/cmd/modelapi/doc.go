// Command modelapi serves the scripted Anthropic Messages API and OpenAI Responses API
// stand-in of package modelapi, for tests and the offline demo only (never production).
// Point the Claude Code CLI at it with ANTHROPIC_BASE_URL=<printed URL> and any
// ANTHROPIC_API_KEY, or the Codex CLI with a model provider whose base_url is
// <printed URL>/v1 and wire_api "responses".
package main
