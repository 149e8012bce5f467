// Package agent is the contract between the stage orchestration and a coding agent adapter
// (Claude Code today, Codex later): run one OpenSpec stage, report what the agent does while it
// works, and return its usage and cost. It must not know about events, git or GitHub.
package agent
