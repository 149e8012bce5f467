package rest

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"
)

// overlay describes what grpc-gateway does not serve (SSE, webhook,
// health, readiness, metrics, console) in Swagger 2.0, plus the page
// limits of query parameters that protoc-gen-openapiv2 cannot express.
// Each of its operations names the ServeMux pattern it documents in
// x-mux-pattern; it is published only when that pattern is mounted.
//
//go:embed openapi_overlay.json
var overlay []byte

// muxPatternKey ties an overlay operation to the route it documents.
const muxPatternKey = "x-mux-pattern"

var httpMethods = []string{"get", "put", "post", "delete", "options", "head", "patch"}

// document merges the generated document (base) with the overlay and keeps
// only what this gateway serves: operations of the gRPC services it
// registered (by the operationId prefix protoc-gen-openapiv2 writes,
// "TaskService_…") and overlay operations whose pattern is mounted.
func document(base, over []byte, services, patterns map[string]bool) ([]byte, error) {
	var doc, ov map[string]any
	if err := decodeJSON(base, &doc); err != nil {
		return nil, fmt.Errorf("openapi: generated document: %w", err)
	}
	if err := decodeJSON(over, &ov); err != nil {
		return nil, fmt.Errorf("openapi: overlay: %w", err)
	}
	paths := object(doc, "paths")
	for p, item := range paths {
		ops := item.(map[string]any)
		for _, m := range httpMethods {
			op, ok := ops[m].(map[string]any)
			if !ok {
				continue
			}
			svc, _, _ := strings.Cut(fmt.Sprint(op["operationId"]), "_")
			if !services[svc] {
				delete(ops, m)
			}
		}
		if len(ops) == 0 {
			delete(paths, p)
		}
	}
	for p, item := range object(ov, "paths") {
		for m, op := range item.(map[string]any) {
			pattern, _ := op.(map[string]any)[muxPatternKey].(string)
			if !patterns[pattern] {
				continue
			}
			ops, _ := paths[p].(map[string]any)
			if ops == nil {
				ops = map[string]any{}
				paths[p] = ops
			}
			if _, dup := ops[m]; dup {
				return nil, fmt.Errorf("openapi: overlay redefines %s %s", strings.ToUpper(m), p)
			}
			ops[m] = op
		}
	}
	defs := object(doc, "definitions")
	for name, d := range object(ov, "definitions") {
		if _, dup := defs[name]; dup {
			return nil, fmt.Errorf("openapi: overlay redefines definition %s", name)
		}
		defs[name] = d
	}
	if err := limitQueryParameters(paths, object(ov, "x-query-parameters")); err != nil {
		return nil, err
	}
	pruneDefinitions(doc, defs)
	doc["tags"] = usedTags(paths, append(list(doc["tags"]), list(ov["tags"])...))
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	if err := enc.Encode(doc); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// limitQueryParameters sets minimum, maximum and default of query
// parameters by operationId and name. A limit for a parameter that does
// not exist is an error, so a renamed field cannot drop its limit quietly.
func limitQueryParameters(paths, limits map[string]any) error {
	found := map[string]bool{}
	for _, item := range paths {
		for _, op := range item.(map[string]any) {
			op := op.(map[string]any)
			id, _ := op["operationId"].(string)
			lim, ok := limits[id].(map[string]any)
			if !ok {
				continue
			}
			for _, prm := range list(op["parameters"]) {
				prm := prm.(map[string]any)
				name, _ := prm["name"].(string)
				set, ok := lim[name].(map[string]any)
				if !ok || prm["in"] != "query" {
					continue
				}
				for k, v := range set {
					prm[k] = v
				}
				found[id+"."+name] = true
			}
		}
	}
	for id, lim := range limits {
		for name := range lim.(map[string]any) {
			if !found[id+"."+name] {
				if _, served := findOperation(paths, id); served {
					return fmt.Errorf("openapi: overlay limits %s.%s, which is not a query parameter", id, name)
				}
			}
		}
	}
	return nil
}

func findOperation(paths map[string]any, id string) (map[string]any, bool) {
	for _, item := range paths {
		for _, op := range item.(map[string]any) {
			if op, ok := op.(map[string]any); ok && op["operationId"] == id {
				return op, true
			}
		}
	}
	return nil, false
}

// pruneDefinitions drops the definitions no served operation reaches
// (those of services this gateway does not expose).
func pruneDefinitions(doc, defs map[string]any) {
	const prefix = "#/definitions/"
	reached := map[string]bool{}
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			if ref, ok := v["$ref"].(string); ok && strings.HasPrefix(ref, prefix) {
				name := strings.TrimPrefix(ref, prefix)
				if !reached[name] {
					reached[name] = true
					walk(defs[name])
				}
			}
			for _, x := range v {
				walk(x)
			}
		case []any:
			for _, x := range v {
				walk(x)
			}
		}
	}
	walk(doc["paths"])
	walk(doc["responses"])
	walk(doc["parameters"])
	for name := range defs {
		if !reached[name] {
			delete(defs, name)
		}
	}
}

// usedTags keeps the tags some operation uses, first definition wins, so
// the document does not describe internal services.
func usedTags(paths map[string]any, tags []any) []any {
	used := map[string]bool{}
	for _, item := range paths {
		for _, op := range item.(map[string]any) {
			for _, t := range list(op.(map[string]any)["tags"]) {
				used[fmt.Sprint(t)] = true
			}
		}
	}
	out := []any{}
	for _, t := range tags {
		name := fmt.Sprint(t.(map[string]any)["name"])
		if used[name] {
			out = append(out, t)
			delete(used, name)
		}
	}
	return out
}

func decodeJSON(b []byte, v any) error {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	return d.Decode(v)
}

func object(m map[string]any, key string) map[string]any {
	o, ok := m[key].(map[string]any)
	if !ok {
		o = map[string]any{}
		m[key] = o
	}
	return o
}

func list(v any) []any {
	l, _ := v.([]any)
	return l
}

// routeTable answers which methods the document allows on a request path;
// the gateway routes unknown paths and methods to 404 and 405 with it, so
// what it answers and what it documents cannot drift apart.
type routeTable struct{ routes []route }

// param stands for a {parameter} segment, which matches any non-empty one.
const param = "\x00"

type route struct {
	method string
	segs   []string // literal, or param for a {parameter}
	verb   string   // custom method after ":" in the last segment
}

func newRouteTable(doc []byte) (*routeTable, error) {
	var d struct {
		Paths map[string]map[string]json.RawMessage `json:"paths"`
	}
	if err := json.Unmarshal(doc, &d); err != nil {
		return nil, err
	}
	t := &routeTable{}
	for p, ops := range d.Paths {
		segs, verb := splitPath(p)
		for i, s := range segs {
			if strings.HasPrefix(s, "{") && strings.HasSuffix(s, "}") {
				segs[i] = param
			}
		}
		for m := range ops {
			if slices.Contains(httpMethods, m) {
				t.routes = append(t.routes, route{method: strings.ToUpper(m), segs: segs, verb: verb})
			}
		}
	}
	return t, nil
}

// allowed lists the methods documented for path (escaped form), sorted.
func (t *routeTable) allowed(path string) []string {
	segs, verb := splitPath(path)
	set := map[string]bool{}
	for _, r := range t.routes {
		if r.verb != verb || len(r.segs) != len(segs) {
			continue
		}
		ok := true
		for i, s := range r.segs {
			if s == param && segs[i] == "" || s != param && s != segs[i] {
				ok = false
				break
			}
		}
		if ok {
			set[r.method] = true
		}
	}
	out := make([]string, 0, len(set))
	for m := range set {
		out = append(out, m)
	}
	sort.Strings(out)
	return out
}

// splitPath splits "/v1/tasks/{id}:cancel" into its segments and the
// custom method of the last one ("cancel"). A colon at the start of the
// last segment is not a custom method.
func splitPath(p string) ([]string, string) {
	segs := strings.Split(strings.TrimPrefix(p, "/"), "/")
	last := segs[len(segs)-1]
	verb := ""
	if i := strings.LastIndex(last, ":"); i > 0 && !strings.HasSuffix(last, "}") {
		segs[len(segs)-1], verb = last[:i], last[i+1:]
	}
	return segs, verb
}
