// Package claude drives the Claude Code CLI (`claude -p … --output-format stream-json`) through
// the OpenSpec stages, one invocation per stage resumed on the same conversation, and parses
// its stream-json output line by line: tool calls become observations (files touched, commands
// run), text and tool output become log lines, the result line becomes usage, cost and
// success or failure. It must not redact, batch or send anything itself (the caller does), and
// must not run the CLI as root when it can drop privileges.
package claude
