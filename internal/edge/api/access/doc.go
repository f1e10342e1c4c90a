// Package access is what the HTTP API frame (package api) asks of a
// request's key before it runs: the model it may use.
package access
