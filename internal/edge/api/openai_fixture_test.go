package api

// OpenAIRoutes is package openai's Routes, the frame's tests' main
// fixture. Package openai imports this one, so only the external test
// package may import it: openai_register_test.go sets this before any
// test runs.
var OpenAIRoutes API

// withOpenAI is cfg with the OpenAI routes in its Config.APIs, as the
// edge process registers them.
func withOpenAI(cfg Config) Config {
	cfg.APIs = append([]API{OpenAIRoutes}, cfg.APIs...)
	return cfg
}
