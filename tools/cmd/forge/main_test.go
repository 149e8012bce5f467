package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/taskrunner/taskrunner/tools/forge"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestRunRefusesBadCollaborator(t *testing.T) {
	seed := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(seed, "README.md"), []byte("hi\n"), 0o644))
	for _, c := range []string{"acme/demo", "acme/demo:alice=owner", "acme/nothing:alice=read"} {
		err := run(context.Background(), []string{"--addr", "127.0.0.1:0", "--data-dir", t.TempDir(), "--seed", "acme/demo=" + seed,
			"--collaborator", c}, io.Discard, io.Discard)
		require.ErrorContains(t, err, "--collaborator", c)
	}
}

func TestRunServesSeededRepoAndStops(t *testing.T) {
	data := t.TempDir()
	seed := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(seed, "README.md"), []byte("hi\n"), 0o644))

	pr, pw := io.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"--addr", "127.0.0.1:0", "--data-dir", data, "--seed", "acme/demo=" + seed,
			"--personal-token", "pat", "--app-id", "7", "--collaborator", "acme/demo:alice=write"}, pw, io.Discard)
		pw.Close()
	}()

	lines := bufio.NewScanner(pr)
	require.True(t, lines.Scan())
	first := lines.Text()
	require.True(t, strings.HasPrefix(first, "forge listening on http://127.0.0.1:"), first)
	url := strings.Fields(first)[3]
	require.True(t, lines.Scan())
	require.Equal(t, "app id: 7", lines.Text())
	require.True(t, lines.Scan())
	keyPath := filepath.Join(data, "app-key.pem")
	require.Equal(t, "app key: "+keyPath, lines.Text())
	_, created, err := forge.LoadOrCreateAppKey(keyPath)
	require.NoError(t, err)
	require.False(t, created, "the binary wrote the key")
	go func() { _, _ = io.Copy(io.Discard, pr) }()

	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	req, err := http.NewRequest(http.MethodGet, url+"/api/v3/repos/acme/demo", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "token pat")
	resp, err := client.Do(req)
	require.NoError(t, err)
	var repo struct {
		FullName      string `json:"full_name"`
		DefaultBranch string `json:"default_branch"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&repo))
	require.NoError(t, resp.Body.Close())
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "acme/demo", repo.FullName)
	require.Equal(t, "main", repo.DefaultBranch)

	req, err = http.NewRequest(http.MethodGet, url+"/repos/acme/demo/collaborators/alice/permission", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "token pat")
	resp, err = client.Do(req)
	require.NoError(t, err)
	var perm struct {
		Permission string `json:"permission"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&perm))
	require.NoError(t, resp.Body.Close())
	require.Equal(t, "write", perm.Permission, "--collaborator was applied")

	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("run did not stop")
	}
}
