package openapi

import _ "embed"

// JSON is the OpenAPI v2 document of the public REST API.
//
//go:embed taskrunner.swagger.json
var JSON []byte
