package agent

import (
	"bytes"
	"fmt"
	"strings"
)

// MaxLine bounds one buffered line of an agent's output; a longer line is
// passed on cut (and then parses as malformed).
const MaxLine = 32 << 20

// LineWriter calls Fn for every complete line written to it, so an agent's
// JSON stream can be parsed as it arrives without blocking the process.
type LineWriter struct {
	Fn  func([]byte)
	buf []byte
}

// Write implements io.Writer.
func (w *LineWriter) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			w.buf = append(w.buf, p...)
			if len(w.buf) > MaxLine {
				w.Fn(w.buf)
				w.buf = w.buf[:0]
			}
			break
		}
		if len(w.buf) > 0 {
			w.buf = append(w.buf, p[:i]...)
			w.Fn(w.buf)
			w.buf = w.buf[:0]
		} else {
			w.Fn(p[:i])
		}
		p = p[i+1:]
	}
	return n, nil
}

// Flush passes on a last line that had no newline.
func (w *LineWriter) Flush() {
	if len(w.buf) > 0 {
		w.Fn(w.buf)
		w.buf = nil
	}
}

// LimitLines splits text into at most n lines plus a "… (k more lines)" marker.
func LimitLines(text string, n int) []string {
	lines := strings.Split(strings.TrimRight(text, "\n"), "\n")
	if len(lines) == 1 && lines[0] == "" {
		return nil
	}
	if len(lines) > n {
		more := len(lines) - n
		lines = append(lines[:n:n], fmt.Sprintf("… (%d more lines)", more))
	}
	return lines
}

// FirstLine returns s up to its first newline, marked when cut.
func FirstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i] + " …"
	}
	return s
}

// Clip cuts s to n bytes, marked when cut.
func Clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
