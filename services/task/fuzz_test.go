package task

import (
	"errors"
	"github.com/google/uuid"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/taskrunner/taskrunner/services/errs"
)

// FuzzCursor: a ListTasks page token either is refused as InvalidArgument
// or names a task; a token the server made decodes to its task's place.
func FuzzCursor(f *testing.F) {
	f.Add("", int64(0), "0b0c7f6e-9d5e-4c55-9c1e-1d2f0a3b4c5d")
	f.Add(encodeCursor(Task{ID: "0b0c7f6e-9d5e-4c55-9c1e-1d2f0a3b4c5d", CreatedAt: time.Unix(1700000000, 123)}), int64(1700000000123456789), "x")
	f.Add("eyJpIjoiIn0", int64(-1), "")                // {"i":""}
	f.Add("eyJjIjoiYmFkIiwiaSI6IngifQ", int64(5), "y") // {"c":"bad","i":"x"}
	f.Fuzz(func(t *testing.T, tok string, nanos int64, id string) {
		c, err := decodeCursor(tok)
		switch {
		case err != nil:
			if !errors.Is(err, errs.ErrInvalidArgument) {
				t.Fatalf("a bad token must be InvalidArgument, got %v", err)
			}
		case tok == "":
			if c != nil {
				t.Fatalf("the empty token is the first page, got %+v", c)
			}
		case c == nil || c.ID == "":
			t.Fatalf("token %q decoded to no place: %+v", tok, c)
		}
		if id == "" || !utf8.ValidString(id) {
			return
		}
		at := time.Unix(0, nanos).UTC()
		if _, perr := uuid.Parse(id); perr != nil {
			// Only a task id names a place: anything else is refused, never
			// handed to PostgreSQL's uuid cast (which answered Internal).
			if _, err := decodeCursor(encodeCursor(Task{ID: id, CreatedAt: at})); !errors.Is(err, errs.ErrInvalidArgument) {
				t.Fatalf("a cursor with id %q must be InvalidArgument, got %v", id, err)
			}
			return
		}
		back, err := decodeCursor(encodeCursor(Task{ID: id, CreatedAt: at}))
		if err != nil || back == nil || back.ID != id || !back.CreatedAt.Equal(at) {
			t.Fatalf("cursor (%s, %q) does not round-trip: %+v, %v", at, id, back, err)
		}
	})
}
