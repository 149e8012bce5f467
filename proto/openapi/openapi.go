// Package openapi embeds the OpenAPI v2 document generated from the protos and
// the HTTP rules, so the gateway can serve it at /openapi.json. It holds no
// logic; `make proto` regenerates taskrunner.swagger.json.
package openapi

import _ "embed"

// JSON is the OpenAPI v2 document of the public REST API.
//
//go:embed taskrunner.swagger.json
var JSON []byte
