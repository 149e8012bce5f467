package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/taskrunner/taskrunner/tools/modelapi"
)

// TestModelProxy: every model call of a sandbox goes through the control
// plane's model proxy. A Codex demo task runs with no model key in its
// sandbox, and the usage on its timeline is what the scripted model API
// answered; a Claude task whose budget is below what the demo costs is
// stopped by the proxy and ends failed (budget) with a draft pull request.
func TestModelProxy(t *testing.T) {
	s := startStack(t)
	bearer := "Bearer " + s.token

	code, body := s.do(t, http.MethodPost, s.api+"/v1/tasks", bearer,
		`{"repo":"demo/greet","prompt":"Add a --farewell flag to greet","agent":"AGENT_CODEX","dispatch":true}`)
	require.Equal(t, http.StatusOK, code, "%v", body)
	id := body["task"].(map[string]any)["id"].(string)
	keys := watchForModelKeys(t, id)
	task := s.waitTask(t, id, func(tk map[string]any) bool { return tk["status"] != "TASK_STATUS_RUNNING" })
	require.Equal(t, "TASK_STATUS_AWAITING_REVIEW", task["status"], "%v", task)
	keys.check(t, "codex")

	// The usage the proxy recorded is the usage the upstream answered.
	resp, err := http.Get(s.codexURL + modelapi.RequestsPath)
	require.NoError(t, err)
	defer resp.Body.Close()
	var reqs []modelapi.Request
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&reqs))
	var in, out int64
	calls := 0
	for _, r := range reqs {
		if r.Method == http.MethodPost && strings.HasPrefix(r.Path, "/v1/responses") && r.Status == http.StatusOK {
			in, out, calls = in+r.InputTokens, out+r.OutputTokens, calls+1
		}
	}
	require.Positive(t, calls)
	usage := task["usage"].(map[string]any)
	require.Equal(t, fmt.Sprint(in), fmt.Sprint(usage["tokens_in"]), "tokens in: the proxy's record equals the model API's answers (%d calls)", calls)
	require.Equal(t, fmt.Sprint(out), fmt.Sprint(usage["tokens_out"]), "tokens out")
	require.Positive(t, usage["cost_usd"], "priced from the price table")
	var usageEvents int
	for page := ""; ; {
		code, body := s.do(t, http.MethodGet, s.api+"/v1/tasks/"+id+"/events:list?page_size=1000&page_token="+page, bearer, "")
		require.Equal(t, http.StatusOK, code, "%v", body)
		evs, _ := body["events"].([]any)
		for _, e := range evs {
			if _, ok := e.(map[string]any)["usage"]; ok {
				usageEvents++
			}
		}
		next, _ := body["next_page_token"].(string)
		if next == "" {
			break
		}
		page = next
	}
	require.Equal(t, calls, usageEvents, "one usage event on the timeline per metered call")

	// A budget below what the demo costs: the proxy refuses the call that
	// would cross it, and the runner salvages the work in a draft PR.
	code, body = s.do(t, http.MethodPost, s.api+"/v1/tasks", bearer,
		`{"repo":"demo/greet","prompt":"Add a --farewell flag to greet","max_budget_usd":0.2,"dispatch":true}`)
	require.Equal(t, http.StatusOK, code, "%v", body)
	budgeted := body["task"].(map[string]any)["id"].(string)
	task = s.waitTask(t, budgeted, func(tk map[string]any) bool { return tk["status"] != "TASK_STATUS_RUNNING" })
	require.Equal(t, "TASK_STATUS_FAILED", task["status"], "%v", task)
	require.Contains(t, task["failed_reason"], "budget", "%v", task)
	pr, _ := task["pr_url"].(string)
	require.NotEmpty(t, pr, "the partial work is in a draft PR: %v", task)
	number := pr[strings.LastIndex(pr, "/")+1:]
	code, got := s.do(t, http.MethodGet, s.forgeURL+"/repos/demo/greet/pulls/"+number, "token "+s.forgeToken, "")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, true, got["draft"], "%v", got)
	cost := task["usage"].(map[string]any)["cost_usd"].(float64)
	require.LessOrEqual(t, cost, 0.2, "the proxy kept the task within its budget")
}
