package api_test

import (
	"iop/internal/edge/api"
	"iop/internal/edge/api/openai"
)

func init() { api.OpenAIRoutes = openai.Routes }
