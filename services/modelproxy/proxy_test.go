package modelproxy_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/taskrunner/taskrunner/services/modelproxy"
	"github.com/taskrunner/taskrunner/services/task"
)

// TestMetersBothAPIsStreamingAndNot sends calls for both APIs, streamed and not, through the
// proxy to the scripted model API: the answers pass through unchanged in shape, the upstream
// sees the real key and never the sandbox's, and the task's timeline and row carry exactly
// the usage the scripted API reported, priced from the price table.
func TestMetersBothAPIsStreamingAndNot(t *testing.T) {
	h := newHarness(t, 5)
	cases := []struct {
		api    string
		stream bool
		cost   float64
	}{
		{"anthropic", true, anthropicCallCost},
		{"anthropic", false, anthropicCallCost},
		{"openai", true, openAICallCost},
		{"openai", false, openAICallCost},
	}
	for _, tc := range cases {
		t.Run(fmt.Sprintf("%s stream=%v", tc.api, tc.stream), func(t *testing.T) {
			id := h.runningTask("alice")
			c := h.client(id)
			var total float64
			for i := 1; i <= 2; i++ {
				resp, body := h.call(c, tc.api, tc.stream)
				require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
				if tc.stream {
					require.True(t, strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream"))
					names := sseNames(t, body)
					if tc.api == "anthropic" {
						require.Equal(t, "message_start", names[0])
						require.Equal(t, "message_stop", names[len(names)-1])
					} else {
						require.Equal(t, "response.created", names[0])
						require.Equal(t, "response.completed", names[len(names)-1])
					}
				} else {
					var m map[string]any
					require.NoError(t, json.Unmarshal(body, &m), "%s", body)
					require.Contains(t, m, "usage")
				}
				require.Contains(t, string(body), "Hello from the scripted model.")

				total += tc.cost
				evs := h.usageEvents(id)
				require.Len(t, evs, i, "one usage event per call")
				last := evs[i-1]
				require.Equal(t, fmt.Sprint(i*scriptIn), last["tokens_in"], "running total of input tokens")
				require.Equal(t, fmt.Sprint(i*scriptOut), last["tokens_out"], "running total of output tokens")
				require.InDelta(t, total, last["cost_usd"], 1e-9)
				tk := h.task(id)
				require.Equal(t, int64(i*scriptIn), tk.Usage.TokensIn)
				require.Equal(t, int64(i*scriptOut), tk.Usage.TokensOut)
				require.InDelta(t, total, tk.Usage.CostUSD, 1e-9)
			}
		})
	}
	apiKeys, auths := h.seen.get()
	require.Len(t, apiKeys, 8)
	for i := range apiKeys {
		require.NotContains(t, apiKeys[i]+auths[i], sandboxKey, "the sandbox's credential is never forwarded")
		if i < 4 { // anthropic calls first
			require.Equal(t, anthropicKey, apiKeys[i])
			require.Empty(t, auths[i])
		} else {
			require.Equal(t, "Bearer "+openAIKey, auths[i])
			require.Empty(t, apiKeys[i])
		}
	}
	noSecretsIn(t, h.logs.String(), "the proxy's logs")
}

func sseNames(t *testing.T, body []byte) []string {
	t.Helper()
	var names []string
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(nil, 1<<22)
	for sc.Scan() {
		if n, ok := strings.CutPrefix(sc.Text(), "event: "); ok {
			names = append(names, n)
		}
	}
	require.NoError(t, sc.Err())
	require.NotEmpty(t, names)
	return names
}

// TestRefusesTheCallThatWouldCrossTheBudget: with a budget a little above one call's cost,
// the first call passes and the second, whose input alone would cross the budget, is refused
// with 402 in the API's own error shape, marked as a budget refusal, without reaching the
// upstream; the task's usage stays that of the first call.
func TestRefusesTheCallThatWouldCrossTheBudget(t *testing.T) {
	for _, api := range []string{"anthropic", "openai"} {
		t.Run(api, func(t *testing.T) {
			cost := anthropicCallCost
			if api == "openai" {
				cost = openAICallCost
			}
			h := newHarness(t, cost+0.0001)
			id := h.runningTask("alice")
			c := h.client(id)
			resp, body := h.call(c, api, true)
			require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
			before := len(h.api.Requests())

			resp, body = h.call(c, api, true)
			require.Equal(t, http.StatusPaymentRequired, resp.StatusCode)
			require.Equal(t, "budget", resp.Header.Get(modelproxy.RefusalHeader))
			require.Equal(t, "false", resp.Header.Get("X-Should-Retry"))
			var e map[string]any
			require.NoError(t, json.Unmarshal(body, &e))
			if api == "anthropic" {
				require.Equal(t, "error", e["type"])
				require.Equal(t, "billing_error", e["error"].(map[string]any)["type"])
			} else {
				require.Equal(t, "insufficient_quota", e["error"].(map[string]any)["type"])
			}
			require.Contains(t, e["error"].(map[string]any)["message"], "budget exceeded")
			require.Len(t, h.api.Requests(), before, "the refused call never reached the upstream")
			require.Len(t, h.usageEvents(id), 1)
			require.InDelta(t, cost, h.task(id).Usage.CostUSD, 1e-9)
		})
	}
}

// TestTaskBudgetSetAtCreate: a task's own budget (set at create) is what the proxy enforces
// when it is below the server's maximum, and the maximum still bounds a larger one.
func TestTaskBudgetSetAtCreate(t *testing.T) {
	cost := anthropicCallCost
	h := newHarness(t, 100*cost)
	ctx := context.Background()
	small := h.runningTask("alice")
	require.NoError(t, h.tasks.SetBudget(ctx, small, cost+0.0001))
	c := h.client(small)
	resp, body := h.call(c, "anthropic", true)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
	resp, body = h.call(c, "anthropic", true)
	require.Equal(t, http.StatusPaymentRequired, resp.StatusCode, "the task's own budget is spent: %s", body)
	require.Equal(t, "budget", resp.Header.Get(modelproxy.RefusalHeader))
	require.Contains(t, string(body), fmt.Sprintf("of its %.4f USD budget", cost+0.0001))

	// A budget above the server's maximum (lowered since) is bounded by it.
	h2 := newHarness(t, cost+0.0001)
	big := h2.runningTask("alice")
	require.NoError(t, h2.tasks.SetBudget(ctx, big, 100*cost))
	c2 := h2.client(big)
	resp, body = h2.call(c2, "anthropic", true)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
	resp, body = h2.call(c2, "anthropic", true)
	require.Equal(t, http.StatusPaymentRequired, resp.StatusCode, "the server's maximum bounds the task's budget: %s", body)
	require.Contains(t, string(body), fmt.Sprintf("of its %.4f USD budget", cost+0.0001))
}

// TestRefusesTasksThatDoNotRun: a certificate stays valid until the task's deadline, but
// once the task has ended nothing can be exchanged for a model call with it.
func TestRefusesTasksThatDoNotRun(t *testing.T) {
	h := newHarness(t, 5)
	ctx := context.Background()
	id := h.runningTask("alice")
	c := h.client(id)
	resp, _ := h.call(c, "anthropic", false)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	_, _, err := h.tasks.Advance(ctx, id, "", task.Advance{Status: task.StatusCancelled, FailedReason: "cancelled", RequestID: "cancel"})
	require.NoError(t, err)
	calls := len(h.api.Requests())
	for _, api := range []string{"anthropic", "openai"} {
		resp, body := h.call(c, api, true)
		require.Equal(t, http.StatusForbidden, resp.StatusCode, "%s", body)
		require.Equal(t, "task", resp.Header.Get(modelproxy.RefusalHeader))
		require.Contains(t, string(body), "cancelled")
	}
	// A task that was never dispatched, and one that does not exist.
	tk, _, err := h.tasks.Create(ctx, task.NewTask{Owner: "bob", Repo: "acme/greet", BaseBranch: "main", Prompt: "p", Agent: task.AgentClaude}, "")
	require.NoError(t, err)
	for _, other := range []string{tk.ID, "0e0c1b9e-5b5f-4a8e-9d60-6a0f3c3f0c01"} {
		resp, body := h.call(h.client(other), "anthropic", true)
		require.Equal(t, http.StatusForbidden, resp.StatusCode, "%s", body)
	}
	require.Len(t, h.api.Requests(), calls, "nothing reached the upstream")
}

// TestForwardsOnlyModelCalls: the key opens only the model endpoints, not the rest of the
// provider's API, and an unknown prefix is not forwarded anywhere.
func TestForwardsOnlyModelCalls(t *testing.T) {
	h := newHarness(t, 5)
	c := h.client(h.runningTask("alice"))
	for _, p := range []string{"/anthropic/v1/files", "/openai/v1/files", "/openai/v1/organization/api_keys", "/v1/messages", "/anthropic/../openai/v1/files"} {
		req, err := http.NewRequest(http.MethodPost, h.proxy.URL+p, strings.NewReader("{}"))
		require.NoError(t, err)
		resp, err := c.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusNotFound, resp.StatusCode, p)
	}
	require.Empty(t, h.api.Requests())
}
