package sse

import (
	"bytes"
	"errors"
	"strconv"
	"strings"
)

// errBadEventName: an SSE event name cannot hold a line break (it would end
// the field and start another, chosen by whoever wrote the name).
var errBadEventName = errors.New("sse: event name contains a line break")

// appendFrame renders one SSE message:
//
//	id: <seq>          (left out when seq is 0: the client keeps its last id)
//	event: <typ>       (left out when typ is "": browsers dispatch "message")
//	data: <line>       (one per line of data)
//	<blank line>
//
// It does not rely on data being one line: data is split at every CR, LF
// and CRLF (the line ends of the SSE grammar), each piece on a data line
// of its own, so no byte of data can end the field or the message or start
// another field. A client joins the data lines with LF: data arrives
// unchanged except that CR and CRLF arrive as LF (JSON has neither outside
// its strings, where it escapes them, so JSON arrives unchanged).
func appendFrame(dst []byte, seq int64, typ string, data []byte) ([]byte, error) {
	if strings.ContainsAny(typ, "\r\n") {
		return dst, errBadEventName
	}
	if seq > 0 {
		dst = append(dst, "id: "...)
		dst = strconv.AppendInt(dst, seq, 10)
		dst = append(dst, '\n')
	}
	if typ != "" {
		dst = append(dst, "event: "...)
		dst = append(dst, typ...)
		dst = append(dst, '\n')
	}
	dst = appendData(dst, data)
	return append(dst, '\n'), nil
}

// appendData writes data as data lines (see appendFrame).
func appendData(dst, data []byte) []byte {
	for {
		dst = append(dst, "data: "...)
		i := bytes.IndexAny(data, "\r\n")
		if i < 0 {
			dst = append(dst, data...)
			return append(dst, '\n')
		}
		dst = append(dst, data[:i]...)
		dst = append(dst, '\n')
		if data[i] == '\r' && i+1 < len(data) && data[i+1] == '\n' {
			i++
		}
		data = data[i+1:]
	}
}

// appendIDOnly renders a message with nothing but an id: EventSource
// records it as its last event id and dispatches nothing. The seed view
// ends a stream with one when its last events were of types it does not
// send, so that the reconnect that follows carries the timeline's last seq
// (and gets 204) instead of replaying them forever.
func appendIDOnly(dst []byte, seq int64) []byte {
	dst = append(dst, "id: "...)
	dst = strconv.AppendInt(dst, seq, 10)
	return append(dst, "\n\n"...)
}

// parseLastEventID parses a Last-Event-ID value: empty is 0 (from the
// start); otherwise a non-negative decimal seq, surrounding spaces allowed.
func parseLastEventID(v string) (int64, error) {
	if v == "" {
		return 0, nil
	}
	t := strings.TrimSpace(v)
	// ParseInt would also take a sign; an id is digits only.
	if t == "" || strings.TrimLeft(t, "0123456789") != "" {
		return 0, errors.New("Last-Event-ID must be a sequence number (a non-negative integer), got " + strconv.Quote(v))
	}
	n, err := strconv.ParseInt(t, 10, 64)
	if err != nil {
		return 0, errors.New("Last-Event-ID must be a sequence number (a non-negative integer), got " + strconv.Quote(v))
	}
	return n, nil
}
