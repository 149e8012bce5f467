package codex

import (
	"sync"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// recordingObserver keeps what the stream reported.
type recordingObserver struct {
	mu       sync.Mutex
	lines    []string
	files    []string
	commands []string
}

func (o *recordingObserver) Log(lines ...string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.lines = append(o.lines, lines...)
}

func (o *recordingObserver) FileTouched(p string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.files = append(o.files, p)
}

func (o *recordingObserver) Command(c string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.commands = append(o.commands, c)
}
