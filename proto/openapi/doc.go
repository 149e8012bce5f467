// Package openapi embeds the OpenAPI v2 document generated from the protos and
// the HTTP rules, so the gateway can serve it at /openapi.json. It holds no
// logic; `make proto` regenerates taskrunner.swagger.json.
package openapi
