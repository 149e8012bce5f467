package eventsclient

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"

	"google.golang.org/protobuf/proto"

	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
)

// spill keeps the newest unacknowledged events on disk while the in-memory buffer is full, so
// that a long outage neither blocks the agent nor loses an event nor grows the runner's
// memory. The file holds a queue of length-prefixed (4 bytes, big endian) binary events: push
// appends, pop reads from the front, and once empty the file is truncated so it does not grow
// across outages. It lives in the runner's work directory (0600, created on first use) and is
// removed by remove. Not safe for concurrent use: the client calls it under its mutex.
type spill struct {
	dir    string
	f      *os.File
	w, r   int64 // write and read offsets
	n      int   // events between r and w
	broken bool  // creating, writing or reading failed once: never used again
}

// usable reports whether events may be pushed.
func (s *spill) usable() bool { return s != nil && s.dir != "" && !s.broken }

// len is the number of events waiting on disk.
func (s *spill) len() int {
	if s == nil {
		return 0
	}
	return s.n
}

func (s *spill) push(e *taskrunnerv1.Event) error {
	if !s.usable() {
		return errors.New("eventsclient: no spill file")
	}
	if s.f == nil {
		f, err := os.CreateTemp(s.dir, "taskrunner-events-*.spill")
		if err != nil {
			s.broken = true
			return fmt.Errorf("eventsclient: spill file: %w", err)
		}
		s.f = f
	}
	b, err := proto.Marshal(e)
	if err != nil {
		return fmt.Errorf("eventsclient: spill event %d: %w", e.GetSeq(), err)
	}
	rec := binary.BigEndian.AppendUint32(make([]byte, 0, 4+len(b)), uint32(len(b)))
	rec = append(rec, b...)
	// A short write leaves garbage past w, which the next push overwrites and pop never reads.
	if _, err := s.f.WriteAt(rec, s.w); err != nil {
		s.broken = true
		return fmt.Errorf("eventsclient: spill event %d: %w", e.GetSeq(), err)
	}
	s.w += int64(len(rec))
	s.n++
	return nil
}

func (s *spill) pop() (*taskrunnerv1.Event, error) {
	if s.len() == 0 {
		return nil, errors.New("eventsclient: spill file is empty")
	}
	var hdr [4]byte
	if _, err := s.f.ReadAt(hdr[:], s.r); err != nil {
		s.broken = true
		return nil, fmt.Errorf("eventsclient: read spill file: %w", err)
	}
	size := int64(binary.BigEndian.Uint32(hdr[:]))
	if s.r+4+size > s.w {
		s.broken = true
		return nil, fmt.Errorf("eventsclient: spill file is corrupt at offset %d", s.r)
	}
	b := make([]byte, size)
	if _, err := s.f.ReadAt(b, s.r+4); err != nil {
		s.broken = true
		return nil, fmt.Errorf("eventsclient: read spill file: %w", err)
	}
	e := &taskrunnerv1.Event{}
	if err := proto.Unmarshal(b, e); err != nil {
		s.broken = true
		return nil, fmt.Errorf("eventsclient: spill file is corrupt at offset %d: %w", s.r, err)
	}
	s.r += 4 + size
	s.n--
	if s.n == 0 {
		s.r, s.w = 0, 0
		if err := s.f.Truncate(0); err != nil {
			s.broken = true // the event is read; only the space is not given back
		}
	}
	return e, nil
}

// remove deletes the file. The spill is unusable afterwards.
func (s *spill) remove() error {
	if s == nil || s.f == nil {
		return nil
	}
	name := s.f.Name()
	err := errors.Join(s.f.Close(), os.Remove(name))
	s.f, s.n, s.broken = nil, 0, true
	return err
}

// path is the file's name, "" before the first push.
func (s *spill) path() string {
	if s == nil || s.f == nil {
		return ""
	}
	return s.f.Name()
}
