package e2e

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// checkRedaction runs a task on a repository whose code holds secrets that
// the agent prints while it explores (its Read output is part of the log
// tail), and shows that none of them reaches the events table, read back
// through the public API.
func checkRedaction(t *testing.T, s *stack) {
	root := repoRoot(t)
	files := map[string]string{}
	for _, f := range []string{"README.md", "test.sh", "greet"} {
		b, err := os.ReadFile(filepath.Join(root, "tools", "demo", "sample-repo", f))
		require.NoError(t, err)
		files[f] = string(b)
	}
	secrets := []string{
		"ghp_" + strings.Repeat("Zq9", 12),                          // a GitHub personal token
		"sk-ant-api03-" + strings.Repeat("kX7", 12),                 // an Anthropic key
		"trt_" + strings.Repeat("Mw4", 12),                          // one of our API tokens
		"MIIEvQIBADANBgkqhkiG9w0BAQEFAASC" + strings.Repeat("A", 8), // a private key body
	}
	leak := "# deploy token " + secrets[0] + " and key " + secrets[1] + "\n# api " + secrets[2] + "\n" +
		"# -----BEGIN PRIVATE KEY-----\n# " + secrets[3] + "\n# -----END PRIVATE KEY-----\n"
	files["greet"] = strings.Replace(files["greet"], "set -eu\n", leak+"set -eu\n", 1)
	body, _ := json.Marshal(map[string]any{"owner": "demo", "name": "leaky", "files": files})
	code, resp := s.do(t, http.MethodPost, s.forgeURL+"/_forge/repos", "", string(body))
	require.Equal(t, http.StatusCreated, code, resp)

	bearer := "Bearer " + s.token
	code, resp = s.do(t, http.MethodPost, s.api+"/v1/tasks", bearer, `{"repo":"demo/leaky","prompt":"Add a --farewell flag to greet","dispatch":true}`)
	require.Equal(t, http.StatusOK, code, resp)
	id := resp["task"].(map[string]any)["id"].(string)

	// Wait until the explore stage's Read output (which printed the
	// secrets) has been stored, then stop the task.
	var stored string
	require.Eventually(t, func() bool {
		_, page := s.do(t, http.MethodGet, s.api+"/v1/tasks/"+id+"/events:list?page_size=1000", bearer, "")
		b, _ := json.Marshal(page)
		stored = string(b)
		return strings.Contains(stored, "deploy token")
	}, 3*time.Minute, 250*time.Millisecond, "the agent never printed the file")
	_, _ = s.do(t, http.MethodPost, s.api+"/v1/tasks/"+id+":cancel", bearer, `{}`)

	require.Contains(t, stored, "[REDACTED]")
	for _, secret := range secrets {
		require.NotContains(t, stored, secret, "a secret the agent printed reached the events table")
	}
}
