package session

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/taskrunner/taskrunner/platform/redact"
	"github.com/taskrunner/taskrunner/runner/agent"
	"github.com/taskrunner/taskrunner/runner/proc"
)

// MaxBytes is the largest archive (compressed) the control plane stores.
const MaxBytes = 8 << 20

// maxUnpacked bounds what an archive may expand to, whoever made it.
const maxUnpacked = 256 << 20

// manifestName is the manifest's name in the archive; agent files are named <agent>/….
const manifestName = "taskrunner-session.json"

// ErrTooLarge is returned by Pack when the archive would be over the limit: the session is
// not saved and the next run starts cold.
var ErrTooLarge = errors.New("session archive over 8 MiB")

// Manifest describes a saved session.
type Manifest struct {
	Agent   string        `json:"agent"`
	Run     int           `json:"run"`
	Session agent.Session `json:"session"`
	// Workspace is the checkout the agent worked in; a restore rewrites it to the new one.
	Workspace string `json:"workspace"`
}

// Pack builds the archive: the manifest, then every file (redacted line by line with red).
// A file that vanished is skipped. max <= 0 means MaxBytes.
func Pack(m Manifest, files []agent.SessionFile, red *redact.Redactor, max int) ([]byte, error) {
	if max <= 0 {
		max = MaxBytes
	}
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	add := func(name string, b []byte) error {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o600, Size: int64(len(b)), Typeflag: tar.TypeReg, Format: tar.FormatPAX}); err != nil {
			return err
		}
		_, err := tw.Write(b)
		return err
	}
	mb, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	if err := add(manifestName, mb); err != nil {
		return nil, err
	}
	for _, f := range files {
		b, err := os.ReadFile(f.Path)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("session: %w", err)
		}
		if red != nil {
			b = []byte(red.String(string(b)))
		}
		if err := add(f.Name, b); err != nil {
			return nil, err
		}
		if buf.Len() > max {
			return nil, ErrTooLarge
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	if err := gz.Close(); err != nil {
		return nil, err
	}
	if buf.Len() > max {
		return nil, ErrTooLarge
	}
	return buf.Bytes(), nil
}

// File is one unpacked agent file.
type File struct {
	Name string
	Data []byte
}

// Unpack reads an archive: only regular files, the manifest first.
func Unpack(archive []byte) (Manifest, []File, error) {
	var m Manifest
	gz, err := gzip.NewReader(bytes.NewReader(archive))
	if err != nil {
		return m, nil, fmt.Errorf("session: %w", err)
	}
	tr := tar.NewReader(io.LimitReader(gz, maxUnpacked))
	var files []File
	seenManifest := false
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return m, nil, fmt.Errorf("session: %w", err)
		}
		if h.Typeflag != tar.TypeReg {
			return m, nil, fmt.Errorf("session: %s is not a regular file", h.Name)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			return m, nil, fmt.Errorf("session: %w", err)
		}
		if h.Name == manifestName {
			if err := json.Unmarshal(b, &m); err != nil {
				return m, nil, fmt.Errorf("session: manifest: %w", err)
			}
			seenManifest = true
			continue
		}
		files = append(files, File{Name: h.Name, Data: b})
	}
	if !seenManifest {
		return m, nil, errors.New("session: the archive has no manifest")
	}
	return m, files, nil
}

// Restore writes files where dest says, owned by user (directories it creates too), replacing
// every mention of the old checkout path with the new one so tool calls in the conversation
// name files of this sandbox.
func Restore(files []File, oldWorkspace, newWorkspace string, dest func(name string) (string, error), user *proc.User) error {
	for _, f := range files {
		p, err := dest(f.Name)
		if err != nil {
			return err
		}
		data := f.Data
		if oldWorkspace != "" && newWorkspace != "" && oldWorkspace != newWorkspace {
			data = bytes.ReplaceAll(data, []byte(oldWorkspace), []byte(newWorkspace))
		}
		if err := mkdirAll(filepath.Dir(p), user); err != nil {
			return fmt.Errorf("session: %w", err)
		}
		if err := os.WriteFile(p, data, 0o600); err != nil {
			return fmt.Errorf("session: %w", err)
		}
		if err := proc.Chown(p, user); err != nil {
			return fmt.Errorf("session: %w", err)
		}
	}
	return nil
}

// mkdirAll creates dir and its missing parents, giving each one it creates to user.
func mkdirAll(dir string, user *proc.User) error {
	if st, err := os.Stat(dir); err == nil {
		if !st.IsDir() {
			return fmt.Errorf("%s is not a directory", dir)
		}
		return nil
	}
	if parent := filepath.Dir(dir); parent != dir && !strings.HasSuffix(parent, string(filepath.Separator)+"..") {
		if err := mkdirAll(parent, user); err != nil {
			return err
		}
	}
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	return proc.Chown(dir, user)
}
