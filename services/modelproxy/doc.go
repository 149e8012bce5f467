// Package modelproxy is the control plane's model proxy: every model call of a sandbox goes
// through it. A runner reaches it over mTLS with its task certificate (a loopback forwarder in
// the sandbox, runner/modelproxy, does that for the agent CLIs); the proxy accepts the
// certificate only while its task is running, forwards the call to the configured upstream
// (Anthropic Messages API, OpenAI Responses API; streaming or not) with the real key, meters the
// usage the upstream reports, prices it from a price table, records it on the task's timeline
// (usage events with the running totals, the task row's cost and tokens) and refuses the call
// that would cross the task's budget.
//
// It must never return, log or store a model key, and never forward the credential a sandbox
// sent: only the key this process holds reaches the upstream.
package modelproxy
