package modelproxy_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/taskrunner/taskrunner/runner/agent"
	rmp "github.com/taskrunner/taskrunner/runner/modelproxy"
)

// cliAgent stands in for an agent CLI inside the sandbox: each stage makes model calls to
// the base URL it was given, with the dummy key, until one fails (calls counts the calls
// started: the guard stops the stage while the refused one is still in flight).
type cliAgent struct {
	baseURL string
	calls   int
}

func (c *cliAgent) RunStage(ctx context.Context, _ agent.StageRequest, _ agent.Observer) (agent.Result, error) {
	for {
		b, _ := json.Marshal(map[string]any{"model": testModel, "max_tokens": 100, "stream": true,
			"messages": []any{map[string]any{"role": "user", "content": "hello again"}}})
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.baseURL+"/v1/messages?beta=true", bytes.NewReader(b))
		if err != nil {
			return agent.Result{}, err
		}
		req.Header.Set("X-Api-Key", rmp.DummyKey)
		c.calls++
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return agent.Result{}, err
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return agent.Result{}, fmt.Errorf("API error %d: %s", resp.StatusCode, body)
		}
		if !strings.Contains(string(body), "message_stop") {
			return agent.Result{}, errors.New("stream cut short")
		}
	}
}

// TestForwarderToProxyAndBudgetRefusal runs the sandbox half (the runner's loopback
// forwarder, mTLS with the task certificate) against the control-plane half (the proxy,
// with the scripted model API upstream): calls with the dummy key are answered and metered,
// and the refusal at the budget ends the stage with a limit error whose reason starts with
// "budget", which the runner turns into a draft PR and failed (budget).
func TestForwarderToProxyAndBudgetRefusal(t *testing.T) {
	h := newHarness(t, 2*anthropicCallCost+0.0001)
	id := h.runningTask("alice")
	fwd, err := rmp.Start(strings.TrimPrefix(h.proxy.URL, "https://"), h.taskTLS(id), nil)
	require.NoError(t, err)
	defer fwd.Close()
	require.True(t, strings.HasPrefix(fwd.URL(), "http://127.0.0.1:"), "loopback only")

	cli := &cliAgent{baseURL: fwd.AnthropicBaseURL()}
	_, err = rmp.Guard(cli, fwd).RunStage(context.Background(), agent.StageRequest{}, nil)
	require.ErrorIs(t, err, agent.ErrLimit)
	require.True(t, strings.HasPrefix(err.Error(), "budget exceeded"), err.Error())
	require.Equal(t, 3, cli.calls, "two calls within the budget, the third refused")
	require.Len(t, h.usageEvents(id), 2)
	require.InDelta(t, 2*anthropicCallCost, h.task(id).Usage.CostUSD, 1e-9)
	apiKeys, _ := h.seen.get()
	require.Equal(t, []string{anthropicKey, anthropicKey}, apiKeys, "the upstream got the real key, never the dummy")

	// Every later stage ends at once.
	_, err = rmp.Guard(cli, fwd).RunStage(context.Background(), agent.StageRequest{}, nil)
	require.ErrorIs(t, err, agent.ErrLimit)
	require.Equal(t, 3, cli.calls)

	// The environment the CLI gets holds no model key and points at the forwarder.
	env := fwd.AgentEnv([]string{"PATH=/bin", "ANTHROPIC_API_KEY=" + anthropicKey, "OPENAI_API_KEY=" + openAIKey, "ANTHROPIC_BASE_URL=https://api.anthropic.com"})
	require.Equal(t, []string{"PATH=/bin", "ANTHROPIC_BASE_URL=" + fwd.AnthropicBaseURL(), "ANTHROPIC_API_KEY=" + rmp.DummyKey}, env)
	require.Equal(t, fwd.URL()+"/openai/v1", fwd.OpenAIBaseURL())
}
