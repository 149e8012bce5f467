package deploytest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/caarlos0/env/v11"
	"github.com/stretchr/testify/require"

	"github.com/taskrunner/taskrunner/services/config"
)

// The README covers each path and every provider taskrunnerd accepts, with that provider's
// required variables in its row of the switching table.
func TestReadmeCoversPathsAndProviders(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(deployDir, "README.md"))
	require.NoError(t, err)
	readme := string(raw)
	for _, h := range []string{"## Path 1: one host with Docker Compose", "## Path 2: Kubernetes", "## Path 3: Fly.io",
		"## Switching sandbox providers", "First task"} {
		require.Contains(t, readme, h)
	}
	var d config.Daemon
	require.NoError(t, env.ParseWithOptions(&d, env.Options{Environment: map[string]string{}}))
	rows := map[string]string{}
	for _, line := range strings.Split(readme, "\n") {
		if strings.HasPrefix(line, "| `") {
			name, _, _ := strings.Cut(strings.TrimPrefix(line, "| `"), "`")
			rows[name] = line
		}
	}
	accepted := 0
	for _, p := range []string{"process", "docker", "fly", "kubernetes", "boxlite", "firecracker", "nomad", "e2b"} {
		d.SandboxProvider = p
		if d.Validate() != nil {
			continue
		}
		accepted++
		row, ok := rows[p]
		require.True(t, ok, "README's provider table has no row for %s", p)
		if owner := "provider/" + p; configs[owner] != nil {
			for name := range providerRequired(t, owner) {
				require.Contains(t, row, name, "%s row", p)
			}
		}
	}
	require.Equal(t, 5, accepted, "taskrunnerd accepts a different set of providers now: update the README and this list")
}
