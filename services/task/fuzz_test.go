package task

import (
	"errors"
	"strings"
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
	f.Add("eyJpIjoiIn0", int64(-1), "")           // {"i":""}
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
		back, err := decodeCursor(encodeCursor(Task{ID: id, CreatedAt: at}))
		if err != nil || back == nil || back.ID != id || !back.CreatedAt.Equal(at) {
			t.Fatalf("cursor (%s, %q) does not round-trip: %+v, %v", at, id, back, err)
		}
	})
}

// FuzzCleanReason: a reason is at most MaxReasonBytes, valid UTF-8 when it
// came in valid, keeps no credential the pattern knows, and cleaning it
// again changes nothing.
func FuzzCleanReason(f *testing.F) {
	f.Add("timeout")
	f.Add("push failed: https://x-access-token:ghs_abcdefghijklmnopqrstuvwxyz0123@github.com/a/b")
	f.Add("Authorization: Bearer abcdefghijklmnopqrstuvwxyz")
	f.Add(strings.Repeat("é", 600) + " ghp_" + strings.Repeat("a", 36))
	f.Add("-----BEGIN RSA PRIVATE KEY-----\nMIIE\n-----END RSA PRIVATE KEY-----")
	f.Add("sk-ant-" + strings.Repeat("x", 40))
	f.Fuzz(func(t *testing.T, s string) {
		out := CleanReason(s)
		if len(out) > MaxReasonBytes {
			t.Fatalf("%d bytes, more than %d", len(out), MaxReasonBytes)
		}
		if utf8.ValidString(s) && !utf8.ValidString(out) {
			t.Fatalf("valid UTF-8 in, invalid out: %q", out)
		}
		if loc := secretPattern.FindStringIndex(out); loc != nil {
			// Truncation may cut a long "[REDACTED]" neighbour into a
			// new match only if a secret survived: none may.
			t.Fatalf("a credential survived: %q", out[loc[0]:loc[1]])
		}
		if again := CleanReason(out); again != out {
			t.Fatalf("not idempotent: %q then %q", out, again)
		}
	})
}
