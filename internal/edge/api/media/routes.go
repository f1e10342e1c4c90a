package media

import (
	"encoding/json"
	"net/http"
	"time"

	"iop/internal/edge/api"
	"iop/internal/edge/contract"
)

// Paths of the routes.
const (
	rerankPath         = "/v1/rerank"
	rerankRootPath     = "/rerank"
	transcriptionsPath = "/v1/audio/transcriptions"
	speechPath         = "/v1/audio/speech"
	imagesPath         = "/v1/images/generations"
	infillPath         = "/infill"
	completionPath     = "/completion"
)

// Capabilities a provider advertises (its node's config, capabilities:)
// to be a candidate for each route; a model none of whose providers has
// it is answered 400 unsupported_capability naming it.
const (
	CapRerank          = "rerank"
	CapTranscription   = "transcription"
	CapSpeech          = "speech"
	CapImages          = "images"
	CapInfill          = "infill"
	CapLlamaCompletion = "llama_completion"
)

// Defaults of Config.
const (
	// DefaultMaxUploadBytes is Config.MaxUploadBytes when 0.
	DefaultMaxUploadBytes int64 = 1 << 30 // 1 GiB
	// DefaultUploadReadTimeout is Config.UploadReadTimeout when 0.
	DefaultUploadReadTimeout = 10 * time.Minute
	// DefaultUploadIdleTimeout is Config.UploadIdleTimeout when 0: as
	// nginx's client_body_timeout.
	DefaultUploadIdleTimeout = 60 * time.Second
)

// Config is the media routes' configuration.
type Config struct {
	// MaxUploadBytes caps a multipart upload's body (transcriptions), in
	// bytes; a larger one is answered 413. It is apart from the API's
	// MaxBodyBytes, which the JSON routes keep: an upload is streamed to
	// the provider, never held whole. 0 means DefaultMaxUploadBytes.
	MaxUploadBytes int64
	// UploadReadTimeout bounds reading an upload's body. 0 means
	// DefaultUploadReadTimeout.
	UploadReadTimeout time.Duration
	// UploadIdleTimeout bounds the pause between two reads of an
	// upload's body: a client that sends nothing for this long is
	// answered 408 and its run, if it holds a slot, ends. 0 means
	// DefaultUploadIdleTimeout.
	UploadIdleTimeout time.Duration
	// SpoolDir is the directory of the temporary files that hold what
	// comes before a multipart body's model field beyond maxHeldPrefix
	// bytes ("" is os.TempDir()).
	SpoolDir string
}

// server serves the media routes. Its fields are set by Routes and only
// read after.
type server struct {
	cfg  Config
	held memBudget // bytes the uploads' spools hold in memory, at most maxHeldTotal
}

// Routes returns the media routes for api.Config.Routes and the upload
// route's body limits for api.Config.BodyLimits.
func Routes(cfg Config) (map[string]api.Route, map[string]api.BodyLimit) {
	if cfg.MaxUploadBytes <= 0 {
		cfg.MaxUploadBytes = DefaultMaxUploadBytes
	}
	if cfg.UploadReadTimeout <= 0 {
		cfg.UploadReadTimeout = DefaultUploadReadTimeout
	}
	if cfg.UploadIdleTimeout <= 0 {
		cfg.UploadIdleTimeout = DefaultUploadIdleTimeout
	}
	s := &server{cfg: cfg, held: memBudget{max: maxHeldTotal}}
	jsonRoute := func(name string, op contract.Operation, need string, chk check) api.Route {
		return api.Route{Method: http.MethodPost, Serve: s.json(name, op, need, chk), Operation: name}
	}
	routes := map[string]api.Route{
		rerankPath:         jsonRoute("rerank", contract.OperationRerank, CapRerank, checkRerank),
		rerankRootPath:     jsonRoute("rerank", contract.OperationRerank, CapRerank, checkRerank),
		speechPath:         jsonRoute("speech", contract.OperationSpeech, CapSpeech, checkSpeech),
		imagesPath:         jsonRoute("images", contract.OperationImages, CapImages, checkImages),
		infillPath:         jsonRoute("infill", contract.OperationInfill, CapInfill, checkInfill),
		completionPath:     jsonRoute("llama_completion", contract.OperationLlamaCompletion, CapLlamaCompletion, checkLlamaCompletion),
		transcriptionsPath: {Method: http.MethodPost, Serve: s.transcription, Operation: "transcription"},
	}
	limits := map[string]api.BodyLimit{
		transcriptionsPath: {MaxBytes: cfg.MaxUploadBytes, ReadTimeout: cfg.UploadReadTimeout},
	}
	return routes, limits
}

// fields are a JSON body's top-level members, undecoded.
type fields map[string]json.RawMessage

// check checks a route's decoded body and returns its estimated input
// tokens; its errors are api.InvalidParam's.
type check func(f fields) (tokens int, err error)

// json returns the handler of a JSON route: it reads the body (the API's
// MaxBodyBytes), requires a JSON object with a string "model", runs the
// route's check, and relays the body as it came to a provider with
// capability need (Stream set by a "stream": true).
func (s *server) json(name string, op contract.Operation, need string, chk check) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		body, err := api.ReadJSONBody(r)
		if err != nil {
			api.WriteError(w, r, err)
			return
		}
		var f fields
		if json.Unmarshal(body, &f) != nil || f == nil {
			api.WriteError(w, r, api.InvalidParam("", "the body must be a JSON object"))
			return
		}
		model, err := stringField(f, "model", true)
		if err != nil {
			api.WriteError(w, r, err)
			return
		}
		tokens, err := chk(f)
		if err != nil {
			api.WriteError(w, r, err)
			return
		}
		stream := false
		if raw, ok := f["stream"]; ok && json.Unmarshal(raw, &stream) != nil {
			api.WriteError(w, r, api.InvalidParam("stream", "must be a boolean"))
			return
		}
		api.Relay(w, r, name, contract.Request{
			Model:                model,
			Operation:            op,
			Stream:               stream,
			Body:                 body,
			Needs:                []string{need},
			EstimatedInputTokens: tokens,
		})
	}
}
