package testkit

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"strings"
)

// SSEMessage is one Server-Sent Events message, or one comment line, as a
// client sees it. Multi-line data is joined with "\n".
type SSEMessage struct {
	ID, Event, Data, Retry string
	HasID, HasData         bool
	// Comment is the text of a comment (": ping"), the only field set then.
	Comment string
}

// SSEReader reads an event stream message by message.
type SSEReader struct{ rd *bufio.Reader }

// NewSSEReader reads r (a response body) as an event stream.
func NewSSEReader(r io.Reader) *SSEReader { return &SSEReader{rd: bufio.NewReaderSize(r, 1<<20)} }

// Next returns the next message or comment: io.EOF at a clean end of the
// stream, an error for a message cut off or an unknown field.
func (r *SSEReader) Next() (SSEMessage, error) {
	var m SSEMessage
	seen := false
	for {
		line, err := r.rd.ReadString('\n')
		if err != nil {
			if errors.Is(err, io.EOF) && line == "" && !seen {
				return m, io.EOF
			}
			return m, fmt.Errorf("truncated message %q: %w", line, err)
		}
		line = strings.TrimSuffix(line, "\n")
		if line == "" {
			if seen {
				return m, nil
			}
			continue
		}
		seen = true
		field, value, _ := strings.Cut(line, ":")
		value = strings.TrimPrefix(value, " ")
		switch field {
		case "":
			m.Comment = value
		case "id":
			m.ID, m.HasID = value, true
		case "event":
			m.Event = value
		case "data":
			if m.HasData {
				m.Data += "\n"
			}
			m.Data += value
			m.HasData = true
		case "retry":
			m.Retry = value
		default:
			return m, fmt.Errorf("unexpected field %q", line)
		}
	}
}

// Events reads messages, skipping comments, to the end of the stream.
func (r *SSEReader) Events() ([]SSEMessage, error) {
	var out []SSEMessage
	for {
		m, err := r.Next()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		if m.Comment != "" {
			continue
		}
		out = append(out, m)
	}
}

// Rest returns the raw rest of the stream.
func (r *SSEReader) Rest() ([]byte, error) { return io.ReadAll(r.rd) }
