// Package modelproxy is the runner's loopback forwarder to the control plane's model proxy.
// The agent CLIs cannot present a client certificate, so the runner listens on
// 127.0.0.1:<random port>, gives the CLIs that address as their API base URL with a dummy key,
// and forwards every call over mTLS with the task certificate. No model key ever enters the
// sandbox; the certificate is worth a model call only while the task runs.
//
// It must not add a credential of its own to what it forwards (the control plane injects the
// real key) and must not outlive the runner. Guard turns the proxy's budget refusal into the
// runner's limit path (draft PR, failed: budget).
package modelproxy
