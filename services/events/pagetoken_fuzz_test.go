package events

import (
	"errors"
	"testing"

	"github.com/taskrunner/taskrunner/services/errs"
)

// FuzzPageToken: a client's page token either is refused as InvalidArgument
// or names a seq that is not negative and encodes back to a token naming
// the same seq; every seq's token decodes to it.
func FuzzPageToken(f *testing.F) {
	f.Add("", int64(0))
	f.Add(encodePageToken(42), int64(42))
	f.Add("ZXYxOi0x", int64(1<<62)) // "ev1:-1"
	f.Add("seq=5", int64(7))
	f.Add(encodePageToken(1)+"=", int64(9223372036854775807))
	f.Fuzz(func(t *testing.T, tok string, seq int64) {
		got, err := decodePageToken(tok)
		switch {
		case err != nil:
			if !errors.Is(err, errs.ErrInvalidArgument) {
				t.Fatalf("a bad token must be InvalidArgument, got %v", err)
			}
		case got < 0:
			t.Fatalf("token %q decoded to a negative seq %d", tok, got)
		default:
			if again, err := decodePageToken(encodePageToken(got)); err != nil || again != got {
				t.Fatalf("seq %d from %q does not round-trip: %d, %v", got, tok, again, err)
			}
		}
		if seq < 0 {
			return
		}
		if back, err := decodePageToken(encodePageToken(seq)); err != nil || back != seq {
			t.Fatalf("encodePageToken(%d) decodes to %d, %v", seq, back, err)
		}
	})
}
