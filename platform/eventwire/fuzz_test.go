package eventwire_test

import (
	"bytes"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/taskrunner/taskrunner/platform/eventwire"
	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
)

// FuzzMessageRoundTrip: every message EncodeMessage can make for a valid
// header decodes to what was encoded.
func FuzzMessageRoundTrip(f *testing.F) {
	f.Add(int64(1), "log", false, []byte(`{"seq":"1","log":{"lines":["a"]}}`))
	f.Add(int64(9), "status_change", true, []byte("{}\n"))
	f.Add(int64(1<<62), "x", false, []byte("\n\n"))
	f.Fuzz(func(t *testing.T, seq int64, typ string, final bool, payload []byte) {
		if seq < 1 || typ == "" || strings.ContainsAny(typ, " \r\n:") || len(payload) == 0 {
			return
		}
		m, err := eventwire.DecodeMessage(eventwire.EncodeMessage(seq, typ, final, payload))
		if err != nil {
			t.Fatalf("decode of an encoded message: %v", err)
		}
		if m.Seq != seq || m.Type != typ || m.Final != final || !bytes.Equal(m.Payload, payload) {
			t.Fatalf("round trip changed the message: %+v", m)
		}
	})
}

// FuzzEncodeMessageBody: the one-buffer form is EncodeMessage of WithSeqRun,
// and its payload is WithSeqRun.
func FuzzEncodeMessageBody(f *testing.F) {
	f.Add(int64(1), int32(0), "log", false, []byte(`{"log":{"lines":["a"]}}`))
	f.Add(int64(12), int32(3), "status_change", true, []byte(` { } `))
	f.Add(int64(-4), int32(-1), "x", false, []byte(``))
	f.Fuzz(func(t *testing.T, seq int64, run int32, typ string, final bool, body []byte) {
		msg, payload := eventwire.EncodeMessageBody(seq, run, typ, final, body)
		want := eventwire.WithSeqRun(seq, run, body)
		if !bytes.Equal(payload, want) {
			t.Fatalf("payload %q, want %q", payload, want)
		}
		if got := eventwire.EncodeMessage(seq, typ, final, want); !bytes.Equal(msg, got) {
			t.Fatalf("message %q, want %q", msg, got)
		}
		if !bytes.HasSuffix(msg, payload) || &msg[len(msg)-1] != &payload[len(payload)-1] {
			t.Fatal("the payload is not the message's tail")
		}
	})
}

// FuzzDecodeMessage: any bytes from a Redis channel either fail to decode
// or decode to a message that encodes and decodes to itself.
func FuzzDecodeMessage(f *testing.F) {
	f.Add([]byte("1 log\n{}"))
	f.Add([]byte("7 status_change final\n{\"seq\":\"7\"}"))
	f.Add([]byte("0 log\n{}"))
	f.Add([]byte("+5 log x\n{}"))
	f.Add([]byte("5 lo:g\n{}"))
	f.Add([]byte("\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := eventwire.DecodeMessage(b)
		if err != nil {
			return
		}
		if m.Seq < 1 || m.Type == "" || strings.ContainsAny(m.Type, "\r\n: ") || len(m.Payload) == 0 {
			t.Fatalf("decoded an invalid message: %+v", m)
		}
		again, err := eventwire.DecodeMessage(eventwire.EncodeMessage(m.Seq, m.Type, m.Final, m.Payload))
		if err != nil || again.Seq != m.Seq || again.Type != m.Type || again.Final != m.Final || !bytes.Equal(again.Payload, m.Payload) {
			t.Fatalf("re-encoding changed %+v into %+v (%v)", m, again, err)
		}
	})
}

// FuzzDecodeEvent: any stored payload either fails to decode or decodes to
// an event whose encodings (EncodeEvent, and EncodeBody completed by
// WithSeq, the committer's path) decode to the same event.
func FuzzDecodeEvent(f *testing.F) {
	f.Add([]byte(`{"seq":"3","log":{"lines":["hello","world"]}}`))
	f.Add([]byte(`{"seq":"4","stage_change":{"stage":"TASK_STAGE_APPLY"}}`))
	f.Add([]byte(`{"seq":"5","failed":{"reason":"timeout","pr_url":"https://x/pull/1","pr_number":"1"}}`))
	f.Add([]byte(`{"seq":"6","status_change":{"from":"TASK_STATUS_RUNNING","to":"TASK_STATUS_FAILED","reason":"r","actor":"reaper"}}`))
	f.Add([]byte(`{"unknown":1}`))
	f.Add([]byte(`{"seq":"-1"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		e, err := eventwire.DecodeEvent(b)
		if err != nil {
			return
		}
		enc, err := eventwire.EncodeEvent(e)
		if err != nil {
			return // e.g. invalid UTF-8 kept from the input is not encodable
		}
		back, err := eventwire.DecodeEvent(enc)
		if err != nil || !proto.Equal(e, back) {
			t.Fatalf("EncodeEvent round trip: %v\n%s", err, enc)
		}
		body, err := eventwire.EncodeBody(e)
		if err != nil {
			t.Fatalf("EncodeBody failed where EncodeEvent worked: %v", err)
		}
		seq := e.GetSeq()
		if seq < 0 {
			return
		}
		viaBody, err := eventwire.DecodeEvent(eventwire.WithSeq(seq, body))
		if err != nil {
			t.Fatalf("WithSeq(%d, %s) does not decode: %v", seq, body, err)
		}
		want := proto.Clone(e).(*taskrunnerv1.Event)
		clearRun(want) // WithSeq writes no run
		clearRun(viaBody)
		if !proto.Equal(want, viaBody) {
			t.Fatalf("WithSeq path changed the event:\n%v\n%v", want, viaBody)
		}
	})
}

// clearRun clears Event.run where the protocol has it.
func clearRun(e *taskrunnerv1.Event) {
	m := e.ProtoReflect()
	if fd := m.Descriptor().Fields().ByName("run"); fd != nil {
		m.Clear(fd)
	}
}
