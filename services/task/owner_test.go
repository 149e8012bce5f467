package task_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// tableWrites matches SQL that writes the tasks table or a task's timeline,
// or locks task rows for a decision: the statements only package task may
// hold (see the package doc).
var tableWrites = regexp.MustCompile(`(?is)\b(UPDATE\s+tasks\b|INSERT\s+INTO\s+(tasks|task_events)\b|DELETE\s+FROM\s+(tasks|task_events)\b|FROM\s+tasks\b[^;` + "`" + `]*\bFOR\s+UPDATE)`)

// TestOnlyTaskWritesTasks scans every non-test Go file of every module for
// SQL that writes the tasks table or the timeline and fails on any outside
// services/task. Migrations (SQL files) define the schema and are not Go.
func TestOnlyTaskWritesTasks(t *testing.T) {
	root, err := filepath.Abs("../..")
	require.NoError(t, err)
	var offenders []string
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case "node_modules", ".git", ".dev", "gen":
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		rel, _ := filepath.Rel(root, path)
		if strings.HasPrefix(rel, filepath.Join("services", "task")+string(filepath.Separator)) ||
			// The benchmark's baseline re-creates the replaced HMAC design's
			// own writes, to measure against; it is not part of the product.
			rel == filepath.Join("tools", "bench", "baseline.go") ||
			// The benchmark's physical reference inserts the same rows with
			// plain batched INSERTs, what PostgreSQL does with nothing in
			// the way; it is not part of the product either.
			rel == filepath.Join("tools", "bench", "physical.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range tableWrites.FindAllString(string(b), -1) {
			offenders = append(offenders, rel+": "+strings.Join(strings.Fields(m), " "))
		}
		return nil
	})
	require.NoError(t, err)
	require.Empty(t, offenders, "SQL that writes tasks or task_events belongs in package task (services/task)")
}

// TestTheCheckCatchesAWrite makes sure the pattern is not toothless.
func TestTheCheckCatchesAWrite(t *testing.T) {
	for _, q := range []string{
		"UPDATE tasks SET status = 'failed'",
		"update  tasks set x = 1",
		"INSERT INTO task_events (task_id) VALUES ($1)",
		"DELETE FROM tasks WHERE id = $1",
		"SELECT owner FROM tasks WHERE id = $1 FOR UPDATE",
	} {
		require.Regexp(t, tableWrites, q)
	}
	require.NotRegexp(t, tableWrites, "SELECT count(*) FROM tasks WHERE status = 'queued'")
	require.NotRegexp(t, tableWrites, "UPDATE sandboxes SET state = 'destroyed'")
}
