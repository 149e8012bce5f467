package session_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/rand"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/taskrunner/taskrunner/platform/redact"
	"github.com/taskrunner/taskrunner/runner/agent"
	"github.com/taskrunner/taskrunner/runner/agent/claude"
	"github.com/taskrunner/taskrunner/runner/session"
)

func TestPackUnpackRestore(t *testing.T) {
	src := t.TempDir()
	transcript := filepath.Join(src, "s1.jsonl")
	secret := "ghs_" + "Q7w9Zx1Lp3Vb5Nm8Rt2Yk4Hj6Gf0Dc9Sa"
	require.NoError(t, os.WriteFile(transcript, []byte(`{"cwd":"/old/ws","tool":"Read /old/ws/greet","out":"token `+secret+`"}`+"\n"), 0o600))
	red, err := redact.New(nil)
	require.NoError(t, err)
	red.AddLiteral(secret)
	m := session.Manifest{Agent: "claude", Run: 1, Session: agent.Session{ID: "s1", TotalCostUSD: 0.29}, Workspace: "/old/ws"}
	archive, err := session.Pack(m, []agent.SessionFile{
		{Name: "claude/s1.jsonl", Path: transcript},
		{Name: "claude/s1/gone.txt", Path: filepath.Join(src, "gone.txt")}, // vanished: skipped
	}, red, 0)
	require.NoError(t, err)

	got, files, err := session.Unpack(archive)
	require.NoError(t, err)
	require.Equal(t, m, got)
	require.Len(t, files, 1)
	require.NotContains(t, string(files[0].Data), secret, "the archive is redacted")
	require.Contains(t, string(files[0].Data), redact.Mask)

	home := t.TempDir()
	ws := filepath.Join(t.TempDir(), "repo")
	require.NoError(t, os.Mkdir(ws, 0o755))
	ad := claude.New(claude.Config{Dir: ws, Env: []string{"HOME=" + home}})
	require.NoError(t, session.Restore(files, got.Workspace, ws, ad.RestorePath, nil))
	b, err := os.ReadFile(filepath.Join(home, ".claude", "projects", claude.ProjectSlug(ws), "s1.jsonl"))
	require.NoError(t, err)
	require.Contains(t, string(b), `"cwd":"`+ws+`"`)
	require.Contains(t, string(b), "Read "+ws+"/greet")
	require.NotContains(t, string(b), "/old/ws")

	// The adapter lists what it would save from the restored place.
	ad.Resume(got.Session)
	listed, err := ad.SessionFiles()
	require.NoError(t, err)
	require.Equal(t, []agent.SessionFile{{Name: "claude/s1.jsonl", Path: filepath.Join(home, ".claude", "projects", claude.ProjectSlug(ws), "s1.jsonl")}}, listed)
}

func TestRefusals(t *testing.T) {
	// Too large: incompressible data over the cap.
	big := filepath.Join(t.TempDir(), "big")
	data := make([]byte, 64<<10)
	_, _ = rand.Read(data)
	require.NoError(t, os.WriteFile(big, data, 0o600))
	_, err := session.Pack(session.Manifest{Agent: "claude"}, []agent.SessionFile{{Name: "claude/x.jsonl", Path: big}}, nil, 32<<10)
	require.ErrorIs(t, err, session.ErrTooLarge)

	// Names that would escape the agent's directory.
	ad := claude.New(claude.Config{Dir: t.TempDir(), Home: t.TempDir()})
	for _, name := range []string{"claude/../../etc/passwd", "claude//x", "codex/sessions/x", "claude/", "/claude/x", "claude/a/./b"} {
		_, err := ad.RestorePath(name)
		require.Error(t, err, name)
	}

	// Links and a missing manifest are refused.
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	require.NoError(t, tw.WriteHeader(&tar.Header{Name: "claude/x.jsonl", Typeflag: tar.TypeSymlink, Linkname: "/etc/passwd"}))
	require.NoError(t, tw.Close())
	require.NoError(t, gz.Close())
	_, _, err = session.Unpack(buf.Bytes())
	require.ErrorContains(t, err, "not a regular file")
	_, _, err = session.Unpack([]byte("not gzip"))
	require.Error(t, err)
}
