package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
)

func TestTokenCreateListRevoke(t *testing.T) {
	addr, db, admin := serve(t)

	out, err := taskctl(t, "--database-url", db.URL, "--json", "token", "create", "--owner", "alice", "--name", "ci", "--expires", "720h")
	require.NoError(t, err, out)
	var created struct {
		Secret string          `json:"secret"`
		Token  json.RawMessage `json:"token"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &created))
	tok := &taskrunnerv1.Token{}
	requireRESTShape(t, string(created.Token), tok)
	require.Equal(t, "ci", tok.GetName())
	require.Equal(t, "alice", tok.GetOwner())
	require.InDelta(t, 720*time.Hour, tok.GetExpireTime().AsTime().Sub(tok.GetCreateTime().AsTime()), float64(time.Second))

	// Plain output: the secret alone on stdout, for $(taskctl token create …).
	out, err = taskctl(t, "--database-url", db.URL, "token", "create", "--owner", "bob")
	require.NoError(t, err, out)
	require.Regexp(t, `^trt_[A-Za-z0-9_-]+\n$`, out)

	ci := []string{"--addr", addr, "--token", created.Secret}
	out, err = taskctl(t, append(ci, "token", "list")...)
	require.NoError(t, err, out)
	require.Contains(t, out, tok.GetId())
	require.Regexp(t, `(?m)^`+tok.GetId()+`\s+ci\s+tasks\s+.*active$`, out)
	require.Equal(t, 3, len(strings.Split(strings.TrimSpace(out), "\n")), "header and alice's two tokens, not bob's:\n%s", out)

	// Revoke the admin token with the ci token; the admin token is refused
	// from then on, and listed as revoked with --all.
	out, err = taskctl(t, append(ci, "--json", "token", "list")...)
	require.NoError(t, err, out)
	list := &taskrunnerv1.ListTokensResponse{}
	requireRESTShape(t, out, list)
	var adminID string
	for _, tk := range list.GetTokens() {
		if tk.GetId() != tok.GetId() {
			adminID = tk.GetId()
		}
	}
	require.NotEmpty(t, adminID)
	out, err = taskctl(t, append(ci, "token", "revoke", adminID)...)
	require.NoError(t, err, out)
	require.Contains(t, out, "token "+adminID+" (unnamed) revoked")
	_, err = taskctl(t, "--addr", addr, "--token", admin, "task", "list")
	require.ErrorContains(t, err, "bearer token revoked")
	out, err = taskctl(t, append(ci, "token", "list")...)
	require.NoError(t, err, out)
	require.NotContains(t, out, adminID)
	out, err = taskctl(t, append(ci, "token", "list", "--all")...)
	require.NoError(t, err, out)
	require.Regexp(t, `(?m)^`+adminID+`.*revoked$`, out)

	// Someone else's token is not found.
	out, err = taskctl(t, "--database-url", db.URL, "--json", "token", "create", "--owner", "mallory")
	require.NoError(t, err, out)
	var mallory struct{ Secret string }
	require.NoError(t, json.Unmarshal([]byte(out), &mallory))
	_, err = taskctl(t, "--addr", addr, "--token", mallory.Secret, "token", "revoke", tok.GetId())
	require.ErrorContains(t, err, "not found")
}
