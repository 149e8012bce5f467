package events

import "github.com/taskrunner/taskrunner/platform/eventwire"

// Deprecated names kept while tools/bench moves to package eventwire;
// delete this file once nothing refers to them.
var (
	Channel     = eventwire.Channel
	TypeName    = eventwire.TypeName
	EncodeEvent = eventwire.EncodeEvent
	DecodeEvent = eventwire.DecodeEvent
)

// EncodeMessage is eventwire.EncodeMessage of an event that does not end its
// timeline (deprecated: use eventwire).
func EncodeMessage(seq int64, typ string, payload []byte) []byte {
	return eventwire.EncodeMessage(seq, typ, false, payload)
}
