// Package openapicheck validates the gateway's published OpenAPI document
// (/openapi.json: the generated Swagger 2.0 merged with the gateway's
// overlay) with go-openapi/validate, the Swagger 2.0 validator of
// go-swagger: the JSON schema of the specification plus its semantic
// checks (path parameters, $refs, unique operationIds, defaults and
// examples against their schemas). It has no non-test code.
package openapicheck
