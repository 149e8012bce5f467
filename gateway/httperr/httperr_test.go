package httperr_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/taskrunner/taskrunner/gateway/httperr"
)

type body struct {
	Code    int              `json:"code"`
	Message string           `json:"message"`
	Details []map[string]any `json:"details"`
}

func write(t *testing.T, f func(w http.ResponseWriter)) (*httptest.ResponseRecorder, body) {
	t.Helper()
	rec := httptest.NewRecorder()
	f(rec)
	var b body
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &b), rec.Body.String())
	require.Contains(t, rec.Body.String(), `"details":`, "details are always present")
	require.Equal(t, "application/json", rec.Header().Get("Content-Type"))
	return rec, b
}

func TestWriteClasses(t *testing.T) {
	quota, err := status.New(codes.ResourceExhausted, "20 tasks per 24 h").WithDetails(
		&errdetails.ErrorInfo{Reason: "QUOTA_EXCEEDED", Domain: httperr.Domain, Metadata: map[string]string{"retry_after_seconds": "42"}})
	require.NoError(t, err)
	cases := []struct {
		name       string
		write      func(w http.ResponseWriter)
		httpStatus int
		code       codes.Code
		message    string
		reason     string
		field      string
		header     [2]string
	}{
		{"invalid field", func(w http.ResponseWriter) { httperr.Write(w, httperr.Invalid("prompt", "must not be empty")) },
			400, codes.InvalidArgument, "prompt: must not be empty", httperr.ReasonInvalidArgument, "prompt", [2]string{}},
		{"no route", func(w http.ResponseWriter) { httperr.Write(w, httperr.RouteNotFound("POST", "/v1/nope")) },
			404, codes.NotFound, "no route for POST /v1/nope", httperr.ReasonRouteNotFound, "", [2]string{}},
		{"method not allowed", func(w http.ResponseWriter) {
			httperr.WriteMethodNotAllowed(w, httptest.NewRequest("DELETE", "/v1/tasks", nil), []string{"GET", "POST"})
		}, 405, codes.Unimplemented, "method DELETE not allowed on /v1/tasks; allowed: GET, POST", httperr.ReasonMethodNotAllowed, "", [2]string{"Allow", "GET, POST"}},
		{"too large", func(w http.ResponseWriter) { httperr.WriteHTTP(w, 413, httperr.TooLarge(100, 250)) },
			413, codes.InvalidArgument, "body: the request body is 250 bytes; the limit is 100", httperr.ReasonBodyTooLarge, "body", [2]string{}},
		{"too large while read", func(w http.ResponseWriter) { httperr.WriteHTTP(w, 413, httperr.TooLarge(100, -1)) },
			413, codes.InvalidArgument, "body: the request body exceeds the limit of 100 bytes", httperr.ReasonBodyTooLarge, "body", [2]string{}},
		{"unauthenticated", func(w http.ResponseWriter) { httperr.Write(w, httperr.Unauthenticated("missing bearer token")) },
			401, codes.Unauthenticated, "missing bearer token", httperr.ReasonUnauthenticated, "", [2]string{"WWW-Authenticate", httperr.BearerChallenge}},
		{"quota", func(w http.ResponseWriter) { httperr.Write(w, quota) },
			429, codes.ResourceExhausted, "20 tasks per 24 h", "QUOTA_EXCEEDED", "", [2]string{"Retry-After", "42"}},
		{"unavailable", func(w http.ResponseWriter) { httperr.Write(w, httperr.Unavailable("the task service is unavailable")) },
			503, codes.Unavailable, "the task service is unavailable", httperr.ReasonUnavailable, "", [2]string{}},
		{"invalid UTF-8 in a message", func(w http.ResponseWriter) { httperr.Write(w, status.New(codes.InvalidArgument, "id: \"\xe2\x82\"")) },
			400, codes.InvalidArgument, "id: \"\uFFFD\"", "", "", [2]string{}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rec, b := write(t, tc.write)
			require.Equal(t, tc.httpStatus, rec.Code)
			require.Equal(t, int(tc.code), b.Code)
			require.Equal(t, tc.message, b.Message)
			if tc.header[0] != "" {
				require.Equal(t, tc.header[1], rec.Header().Get(tc.header[0]))
			}
			if tc.reason == "" {
				require.Empty(t, b.Details)
				return
			}
			require.Equal(t, "type.googleapis.com/google.rpc.ErrorInfo", b.Details[0]["@type"])
			require.Equal(t, tc.reason, b.Details[0]["reason"])
			if tc.field != "" {
				require.Len(t, b.Details, 2)
				require.Equal(t, "type.googleapis.com/google.rpc.BadRequest", b.Details[1]["@type"])
				v := b.Details[1]["field_violations"].([]any)[0].(map[string]any)
				require.Equal(t, tc.field, v["field"])
				require.True(t, strings.HasPrefix(b.Message, tc.field+": "))
			}
		})
	}
}

func TestWriteDropsSuccessHeaders(t *testing.T) {
	rec, _ := write(t, func(w http.ResponseWriter) {
		w.Header().Set("Grpcgateway-Content-Type", "application/grpc")
		w.Header().Set("Grpc-Metadata-X", "y")
		w.Header().Set("Content-Length", "9999")
		httperr.Write(w, httperr.RouteNotFound("GET", "/x"))
	})
	for _, k := range []string{"Grpcgateway-Content-Type", "Grpc-Metadata-X", "Content-Length"} {
		require.Empty(t, rec.Header().Get(k), k)
	}
}

func TestTruncate(t *testing.T) {
	cases := []struct {
		in   string
		max  int
		want string
	}{
		{"short", 10, "short"},
		{"exactly10!", 10, "exactly10!"},
		{"abcdefghijk", 10, "abcdefg…"},
		{"ééééé", 8, "éé…"},    // 2-byte runes: 5 bytes left before "…" → 2 runes
		{"日本語の文字列", 10, "日本…"}, // 3-byte runes: 7 bytes → 2 runes
		{"👍👍👍", 6, "…"},        // a 4-byte rune does not fit in 3 bytes
		{"👍👍👍", 2, ""},
		{"ab\xffcd", 10, "ab\uFFFDcd"},
		{"", 0, ""},
	}
	for _, tc := range cases {
		got := httperr.Truncate(tc.in, tc.max)
		require.Equal(t, tc.want, got, "Truncate(%q, %d)", tc.in, tc.max)
		require.True(t, utf8.ValidString(got))
		require.LessOrEqual(t, len(got), max(tc.max, len(tc.want)))
	}
	require.Equal(t, `"`+strings.Repeat("é", 30)+`…"`, httperr.Quote(strings.Repeat("é", 100)))
}

func FuzzTruncate(f *testing.F) {
	f.Add("日本語の文字列", 10)
	f.Add("a\xffb", 2)
	f.Fuzz(func(t *testing.T, s string, n int) {
		if n < 0 || n > 1<<16 {
			return
		}
		got := httperr.Truncate(s, n)
		if !utf8.ValidString(got) {
			t.Fatalf("Truncate(%q, %d) = %q is not valid UTF-8", s, n, got)
		}
		if len(got) > n && utf8.ValidString(s) {
			t.Fatalf("Truncate(%q, %d) = %q is longer than %d", s, n, got, n)
		}
	})
}
