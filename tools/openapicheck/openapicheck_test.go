package openapicheck

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	"github.com/go-openapi/loads"
	"github.com/go-openapi/strfmt"
	"github.com/go-openapi/validate"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/taskrunner/taskrunner/gateway/rest"
)

// published returns /openapi.json as the gateway serves it with every
// route of the overlay mounted. The handlers are placeholders: this test
// is about the document, and gateway/rest's tests check it against the
// real handlers.
func published(t *testing.T) []byte {
	t.Helper()
	b, err := os.ReadFile("../../gateway/rest/openapi_overlay.json")
	require.NoError(t, err)
	var ov struct {
		Paths map[string]map[string]struct {
			Pattern string `json:"x-mux-pattern"`
		} `json:"paths"`
	}
	require.NoError(t, json.Unmarshal(b, &ov))
	extra := map[string]http.Handler{}
	for _, item := range ov.Paths {
		for _, op := range item {
			if op.Pattern != "GET /openapi.json" && op.Pattern != "GET /healthz" && op.Pattern != "GET /readyz" {
				extra[op.Pattern] = http.NotFoundHandler()
			}
		}
	}
	// Never dialled: the document is built without calling a service.
	conn, err := grpc.NewClient("127.0.0.1:1", grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	h, err := rest.Handler(context.Background(), rest.Options{Task: conn, Events: conn, MaxBodyBytes: 1 << 16, Extra: extra})
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	resp, err := http.Get(srv.URL + "/openapi.json")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	doc, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Len(t, extra, strings.Count(string(doc), `"x-mux-pattern"`)-3, "every overlay operation is published")
	return doc
}

func check(t *testing.T, doc []byte) (errs, warnings []string) {
	t.Helper()
	d, err := loads.Analyzed(json.RawMessage(doc), "2.0")
	require.NoError(t, err)
	res, warn := validate.NewSpecValidator(d.Schema(), strfmt.Default).Validate(d)
	for _, e := range res.Errors {
		errs = append(errs, e.Error())
	}
	for _, w := range warn.Errors {
		warnings = append(warnings, w.Error())
	}
	return errs, warnings
}

func TestPublishedDocumentIsValidSwagger2(t *testing.T) {
	errs, warnings := check(t, published(t))
	require.Empty(t, errs)
	for _, w := range warnings {
		// The SSE example is text/event-stream, which the validator
		// says it does not check; any other warning fails.
		require.Contains(t, w, "No validation attempt for examples for media types other than application/json")
	}
}

// TestValidatorRejectsABrokenDocument shows the check can fail: a path
// parameter that is not declared and a dangling $ref are both reported.
func TestValidatorRejectsABrokenDocument(t *testing.T) {
	doc := string(published(t))
	for broken, want := range map[string]string{
		strings.Replace(doc, `"/healthz"`, `"/healthz/{probe}"`, 1):                                 "probe",
		strings.Replace(doc, `"#/definitions/v1CreateTaskRequest"`, `"#/definitions/v1Missing"`, 1): "v1Missing",
		strings.Replace(doc, `"operationId": "Healthz"`, `"operationId": "Readyz"`, 1):              "Readyz",
	} {
		require.NotEqual(t, doc, broken)
		errs, _ := check(t, []byte(broken))
		require.Contains(t, strings.Join(errs, "\n"), want)
	}
}
