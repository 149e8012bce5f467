package eventwire

import (
	"strconv"
	"time"
	"unicode/utf8"

	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
)

// The runner's frequent events (log tails, stage changes, diff stats) are
// encoded here by hand instead of by protojson, which walks the message by
// reflection and was the largest single cost of the Events server's ingest
// (one encode per event). The output is protojson's, byte for byte, minus
// the insignificant whitespace protojson adds at random to discourage byte
// comparisons: the same keys (proto names), in the same order (field
// declaration order), the same escaping, int64 as JSON strings, enums by
// name, timestamps in RFC 3339 with 0, 3, 6 or 9 fractional digits. So it
// is never longer than protojson's form, which is what runners measure
// against the server's size limit. Everything else, and anything unusual
// (an enum number without a name, a timestamp out of range, invalid UTF-8),
// goes through protojson. TestFastJSONIsProtojson and FuzzFastJSON hold the
// two together.

// appendFast appends e's JSON (with "seq" when withSeq and e.Seq is not 0)
// and reports whether it could; when not, b is returned unchanged.
func appendFast(b []byte, e *taskrunnerv1.Event, withSeq bool) ([]byte, bool) {
	start := len(b)
	b = append(b, '{')
	comma := false
	key := func(name string) {
		if comma {
			b = append(b, ',')
		}
		comma = true
		b = append(b, '"')
		b = append(b, name...)
		b = append(b, '"', ':')
	}
	if withSeq && e.GetSeq() != 0 {
		key("seq")
		b = appendInt64String(b, e.GetSeq())
	}
	if e.GetRun() != 0 {
		key("run")
		b = strconv.AppendInt(b, int64(e.GetRun()), 10)
	}
	if t := e.GetTime(); t != nil {
		key("time")
		var ok bool
		if b, ok = appendTimestamp(b, t.GetSeconds(), t.GetNanos()); !ok {
			return b[:start], false
		}
	}
	ok := true
	switch p := e.GetPayload().(type) {
	case *taskrunnerv1.Event_StageChange:
		if p.StageChange == nil {
			return b[:start], false
		}
		key("stage_change")
		b, ok = appendStageChange(b, p.StageChange)
	case *taskrunnerv1.Event_Log:
		if p.Log == nil {
			return b[:start], false
		}
		key("log")
		b, ok = appendLog(b, p.Log)
	case *taskrunnerv1.Event_DiffStats:
		if p.DiffStats == nil {
			return b[:start], false
		}
		key("diff_stats")
		b = appendDiffStats(b, p.DiffStats)
	default:
		return b[:start], false
	}
	if !ok {
		return b[:start], false
	}
	return append(b, '}'), true
}

func appendStageChange(b []byte, s *taskrunnerv1.StageChange) ([]byte, bool) {
	b = append(b, '{')
	comma := false
	if st := s.GetStage(); st != 0 {
		name, ok := taskrunnerv1.TaskStage_name[int32(st)]
		if !ok {
			return b, false
		}
		b = append(b, `"stage":"`...)
		b = append(b, name...)
		b = append(b, '"')
		comma = true
	}
	if c := s.GetChange(); c != "" {
		if comma {
			b = append(b, ',')
		}
		b = append(b, `"change":`...)
		var ok bool
		if b, ok = appendString(b, c); !ok {
			return b, false
		}
	}
	return append(b, '}'), true
}

func appendLog(b []byte, l *taskrunnerv1.Log) ([]byte, bool) {
	b = append(b, '{')
	comma := false
	if lines := l.GetLines(); len(lines) > 0 {
		b = append(b, `"lines":[`...)
		for i, line := range lines {
			if i > 0 {
				b = append(b, ',')
			}
			var ok bool
			if b, ok = appendString(b, line); !ok {
				return b, false
			}
		}
		b = append(b, ']')
		comma = true
	}
	if st := l.GetStage(); st != 0 {
		name, ok := taskrunnerv1.TaskStage_name[int32(st)]
		if !ok {
			return b, false
		}
		if comma {
			b = append(b, ',')
		}
		b = append(b, `"stage":"`...)
		b = append(b, name...)
		b = append(b, '"')
	}
	return append(b, '}'), true
}

func appendDiffStats(b []byte, d *taskrunnerv1.DiffStats) []byte {
	b = append(b, '{')
	comma := false
	for _, f := range [...]struct {
		name string
		v    int64
	}{{"additions", d.GetAdditions()}, {"deletions", d.GetDeletions()}, {"files_changed", d.GetFilesChanged()}} {
		if f.v == 0 {
			continue
		}
		if comma {
			b = append(b, ',')
		}
		comma = true
		b = append(b, '"')
		b = append(b, f.name...)
		b = append(b, '"', ':')
		b = appendInt64String(b, f.v)
	}
	return append(b, '}')
}

// appendInt64String is protojson's int64: a JSON string.
func appendInt64String(b []byte, v int64) []byte {
	b = append(b, '"')
	b = strconv.AppendInt(b, v, 10)
	return append(b, '"')
}

// Timestamp bounds protojson accepts: 0001-01-01T00:00:00Z to
// 9999-12-31T23:59:59Z.
const (
	minTimestampSeconds = -62135596800
	maxTimestampSeconds = 253402300799
)

// appendTimestamp is protojson's google.protobuf.Timestamp: UTC, RFC 3339,
// with 0, 3, 6 or 9 fractional digits.
func appendTimestamp(b []byte, secs int64, nanos int32) ([]byte, bool) {
	if secs < minTimestampSeconds || secs > maxTimestampSeconds || nanos < 0 || nanos >= 1e9 {
		return b, false
	}
	b = append(b, '"')
	// RFC3339 has time's fast path; in UTC it ends with the 'Z' that goes
	// after the fraction.
	b = time.Unix(secs, 0).UTC().AppendFormat(b, time.RFC3339)
	b = b[:len(b)-1]
	if nanos != 0 {
		var frac [10]byte
		f := strconv.AppendInt(frac[:0], int64(nanos)+1e9, 10) // "1" and nine digits
		digits := f[1:]
		switch {
		case nanos%1e6 == 0:
			digits = digits[:3]
		case nanos%1e3 == 0:
			digits = digits[:6]
		}
		b = append(b, '.')
		b = append(b, digits...)
	}
	return append(b, 'Z', '"'), true
}

// appendString is protojson's string: '"' and '\\' escaped, control
// characters as \b \f \n \r \t or \u00XX, everything else (including
// non-ASCII and '<', '>', '&') as it is. Invalid UTF-8 is not encodable.
func appendString(b []byte, s string) ([]byte, bool) {
	b = append(b, '"')
	ascii := true
	last := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= utf8.RuneSelf {
			ascii = false
			continue
		}
		if c >= ' ' && c != '"' && c != '\\' {
			continue
		}
		b = append(b, s[last:i]...)
		last = i + 1
		switch c {
		case '"', '\\':
			b = append(b, '\\', c)
		case '\b':
			b = append(b, '\\', 'b')
		case '\f':
			b = append(b, '\\', 'f')
		case '\n':
			b = append(b, '\\', 'n')
		case '\r':
			b = append(b, '\\', 'r')
		case '\t':
			b = append(b, '\\', 't')
		default:
			const hex = "0123456789abcdef"
			b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		}
	}
	if !ascii && !utf8.ValidString(s) {
		return b, false
	}
	b = append(b, s[last:]...)
	return append(b, '"'), true
}
