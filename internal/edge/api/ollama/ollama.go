package ollama

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"iop/internal/edge/api"
	"iop/internal/edge/api/request"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"iop/internal/edge/contract"
	"iop/internal/modelname"
	"iop/internal/translate"
)

// ollamaVersion is what GET /api/version reports: the Ollama release whose
// API the edge's Ollama routes follow (clients gate features on it).
const ollamaVersion = "0.17.4"

// Content types of Ollama answers (an Ollama server sends these).
const (
	ndjsonContentType = "application/x-ndjson"
	jsonContentType   = "application/json; charset=utf-8"
)

// Config is what the Ollama routes need beyond the frame; every field is
// optional.
type Config struct {
	// Catalog, when set, describes the models for POST /api/show and the
	// tags' details, and lists the loaded ones for GET /api/ps
	// (catalog.go). Nil: /api/show answers from the frame's models alone
	// and /api/ps lists no model.
	Catalog ModelCatalog
	// Shower, when set, asks a model's serving Ollama for POST /api/show's
	// answer. Nil: /api/show is iop's own answer.
	Shower ModelShower
}

// server serves the Ollama routes on one frame. It is read-only after
// Routes.
type server struct {
	f   *api.Frame
	cfg Config
}

// Routes is the Ollama API (Ollama API doc, docs/api.md) for
// api.Config.APIs: its routes by path, and Ollama's error shape
// ({"error":"..."}) for the frame's own failures at "/" and under
// "/api/" (isOllamaPath).
func Routes(cfg Config) api.API {
	return func(f *api.Frame) map[string]api.Route {
		s := &server{f: f, cfg: cfg}
		f.ErrorsFor(isOllamaPath, s.writeError)
		return map[string]api.Route{
			"/":               {Method: http.MethodGet, Serve: s.root},
			"/api/chat":       {Method: http.MethodPost, Serve: func(w http.ResponseWriter, r *http.Request) { s.generate(w, r, true) }, Operation: "ollama.chat"},
			"/api/generate":   {Method: http.MethodPost, Serve: func(w http.ResponseWriter, r *http.Request) { s.generate(w, r, false) }, Operation: "ollama.generate"},
			"/api/embed":      {Method: http.MethodPost, Serve: func(w http.ResponseWriter, r *http.Request) { s.embed(w, r, false) }, Operation: "ollama.embed"},
			"/api/embeddings": {Method: http.MethodPost, Serve: func(w http.ResponseWriter, r *http.Request) { s.embed(w, r, true) }, Operation: "ollama.embed"},
			"/api/tags":       {Method: http.MethodGet, Serve: s.tags},
			"/api/ps":         {Method: http.MethodGet, Serve: s.ps},
			"/api/show":       {Method: http.MethodPost, Serve: s.show},
			"/api/pull":       {Method: http.MethodPost, Serve: s.pull},
			"/api/version":    {Method: http.MethodGet, Serve: s.version},
			"/api/copy":       {Serve: s.manage},
			"/api/delete":     {Serve: s.manage},
			"/api/create":     {Serve: s.manage},
			"/api/push":       {Serve: s.manage},
			blobsPrefix:       {Serve: s.manage},
		}
	}
}

// blobsPrefix is the path of Ollama's blob routes (HEAD and POST
// /api/blobs/sha256:<hex>), which only /api/create uses.
const blobsPrefix = "/api/blobs/"

// manage answers the Ollama routes that manage a model server's own
// models (/api/copy, /api/delete, /api/create, /api/push, /api/blobs/...)
// with 403 and an Ollama error body saying why, whatever the method and
// key: iop is a gateway, and the model servers behind its nodes manage
// their own models (one name may be served by several of them, so no one
// copy or delete would be right). 403, not 404 (which clients read as "no
// such model") nor 5xx (which they may retry, and which counts as the
// gateway's failure). /api/pull is answered apart (pull): clients
// pull before they use a model.
func (s *server) manage(w http.ResponseWriter, r *http.Request) {
	s.writeError(w, r, fmt.Errorf("%w: iop is a gateway and does not create, copy, delete or push models: "+
		"the model servers behind its nodes manage their own models (run ollama on those hosts to change them)", api.ErrModelManagement), nil)
}

// isOllamaPath reports whether path belongs to the Ollama API, whose errors
// are Ollama-shaped (Routes).
func isOllamaPath(path string) bool {
	return path == "/" || strings.HasPrefix(path, "/api/")
}

// root answers GET and HEAD / as Ollama does: clients probe it to
// find a server.
func (s *server) root(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write([]byte("Ollama is running"))
}

// version answers GET /api/version.
func (s *server) version(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"version": ollamaVersion})
}

// generate serves POST /api/chat (chat) and POST /api/generate: it
// translates the body to a canonical OpenAI request (translate), checks it
// as POST /v1/chat/completions does, dispatches it, and renders the run as
// Ollama NDJSON lines or one JSON object (render). A request with
// nothing to generate (no messages, an empty prompt) only "loads" the
// model, as in Ollama: it is answered at once, done_reason "load" ("unload"
// with keep_alive 0), after checking that the model exists.
//
// Any Content-Type is accepted, as Ollama does (its documented curl
// examples send curl's default, application/x-www-form-urlencoded).
// Statuses: 400 a body that cannot be translated or fails the chat checks,
// 404 unknown model (`model 'x' not found`), 413 body
// over api.Config.MaxBodyBytes, then whatever api.Classify maps a dispatch or
// upstream failure to; every error body is {"error":"..."}.
func (s *server) generate(w http.ResponseWriter, r *http.Request, chat bool) {
	from, operation := translate.FromOllamaGenerate, "ollama.generate"
	if chat {
		from, operation = translate.FromOllamaChat, "ollama.chat"
	}
	api.Begin(r, operation)
	tr, req, start, ok := s.request(w, r, from)
	if !ok {
		return
	}
	req.Operation = contract.OperationChat
	req.Stream = true // the canonical body always streams
	api.ClientStreams(r, tr.Stream)
	if tr.LoadOnly {
		resp := translate.NewOllamaResponse(chat, tr.Model, s.f.Now(), "")
		resp.Done, resp.DoneReason = true, "load"
		if tr.Unload {
			resp.DoneReason = "unload"
		}
		s.load(w, r, &req, resp)
		return
	}
	switch tr.Operation {
	case translate.Chat:
		needs, estimate, err := request.TranslatedChatNeeds(&tr)
		if err != nil {
			s.writeError(w, r, err, &req)
			return
		}
		req.Needs, req.EstimatedInputTokens = needs, estimate
	case translate.Completion:
		req.Operation = contract.OperationCompletion
		req.EstimatedInputTokens = tr.EstimatedInputTokens
	}
	if tr.Logprobs {
		req.Needs = append(req.Needs, request.NeedOllamaLogprobs)
	}
	if tr.Thinking && !slices.Contains(req.Needs, request.NeedThinking) {
		req.Needs = append(req.Needs, request.NeedThinking)
	}
	if len(tr.Dropped) > 0 {
		s.f.Logger().Debug("dropping Ollama fields no provider takes", "path", r.URL.Path, "fields", tr.Dropped)
	}

	s.serveRun(w, r, &req, tr.Extension,
		&render{s: s, chat: chat, model: tr.Model, stream: tr.Stream, timings: translate.Timings{Start: start}, noThinking: tr.NoThinking,
			conversation: tr.Conversation})
}

// run renders one run as an Ollama route's answer.
type run interface {
	// begin sets the run to render, once it was dispatched.
	begin(a *api.Answer)
	// tunnel and normalized render the run of each execution path and
	// return the rendering's reason.
	tunnel() string
	normalized() string
}

// serveRun dispatches req and renders its run with o (api.Frame.Serve,
// with Ollama-shaped errors). extension lists the Ollama-only fields the
// request carries, which a tunnel-path provider does not get (logged).
func (s *server) serveRun(w http.ResponseWriter, r *http.Request, req *contract.Request, extension []string, o run) {
	s.f.Serve(w, r, req, api.Renderer{
		WriteError: s.writeError,
		Tunnel: func(a *api.Answer, info contract.DispatchInfo) string {
			if len(extension) > 0 {
				s.f.Logger().Debug("dropping Ollama-only fields for an OpenAI-compatible provider", "run_id", info.RunID, "fields", extension)
			}
			o.begin(a)
			return o.tunnel()
		},
		Normalized: func(a *api.Answer, _ contract.DispatchInfo) string {
			o.begin(a)
			return o.normalized()
		},
	})
}

// request reads the body of an Ollama route and translates it with
// from (a translate.FromOllama* function). It returns the translation, the
// Request to dispatch, with Model, Body and the X-Request-Id header set,
// and when the request arrived; on failure it has answered with the Ollama
// error (400 naming the field, 413) and ok is false.
func (s *server) request(w http.ResponseWriter, r *http.Request, from func([]byte) (translate.Request, error)) (
	tr translate.Request, req contract.Request, start time.Time, ok bool) {
	start = s.f.Now()
	body, err := s.f.ReadAnyBody(r)
	if err == nil {
		tr, err = from(body)
	}
	if err != nil {
		var fe *translate.FieldError
		if errors.As(err, &fe) {
			err = api.InvalidParam(fe.Field, fe.Message)
		}
		s.writeError(w, r, err, nil)
		return translate.Request{}, contract.Request{}, start, false
	}
	req = contract.Request{Model: tr.Model, Body: tr.Body, OllamaFields: tr.OllamaFields, Headers: map[string]string{}}
	if id := r.Header.Get("X-Request-Id"); id != "" {
		req.Headers["X-Request-Id"] = id
	}
	return tr, req, start, true
}

// load answers a request with nothing to generate or embed (Ollama's
// "load", or with keep_alive 0 "unload") with answer, a single object even
// when streaming, for a model the edge knows; else 404.
func (s *server) load(w http.ResponseWriter, r *http.Request, req *contract.Request, answer any) {
	if _, ok := api.KnownModel(s.f.Models(r), req.Model); !ok {
		err := contract.ErrUnknownModel
		if s.f.Known(req.Model) && api.Allowed(r, req.Model) {
			// Served before, and no node serves it now: unavailable, as a
			// request that generates is answered (503), not "pull it".
			err = contract.ErrProviderUnavailable
		}
		s.writeError(w, r, err, req)
		return
	}
	api.AnswerFinished(r.Context()) // nothing was dispatched
	writeJSON(w, http.StatusOK, answer)
}

// errorBody is Ollama's error shape.
type errorBody struct {
	Error string `json:"error"`
}

// errorMessage maps err as api.Classify does and gives the message Ollama
// clients expect: an unknown model is `model 'x' not found` (the text of
// Ollama's chat, generate, embed and show handlers for a name it does not
// have, which clients match on).
func errorMessage(err error, req *contract.Request) (*api.APIError, string) {
	e := api.Classify(err, req)
	if errors.Is(err, contract.ErrUnknownModel) {
		model := ""
		if req != nil {
			model = api.Clip(req.Model)
		}
		if ua, ok := errors.AsType[*contract.UnmatchedAliasError](err); ok {
			// Ollama's words first, which clients match on, then why.
			return e, fmt.Sprintf("model '%s' not found: %s", model, api.Clip(ua.Error()))
		}
		return e, fmt.Sprintf("model '%s' not found", model)
	}
	return e, e.Message
}

// writeError is the Ollama routes' api.ErrorWriter: api.Frame.WriteErrorAs
// with an Ollama error body, {"error":"<message>"} (errorMessage).
func (s *server) writeError(w http.ResponseWriter, r *http.Request, err error, req *contract.Request) {
	s.f.WriteErrorAsType(w, r, err, req, func(err error, req *contract.Request) (*api.APIError, int, any) {
		e, msg := errorMessage(err, req)
		return e, e.Status(), errorBody{Error: msg}
	}, jsonContentType)
}

// writeJSON answers with v as JSON in an Ollama answer's Content-Type.
func writeJSON(w http.ResponseWriter, status int, v any) {
	api.WriteJSONAs(w, status, jsonContentType, v)
}

// listedModel is one entry of GET /api/tags (Ollama API doc, "List Local
// Models"). Its size, digest,
// modified_at and details are what the serving model server said of the
// model (contract.ModelProvider.Details; see representative); a model whose node
// said nothing has size 0, the SHA-256 of its name as digest (stable, so
// clients can tell models apart) and empty details.
type listedModel struct {
	Name       string       `json:"name"`
	Model      string       `json:"model"`
	ModifiedAt string       `json:"modified_at,omitempty"`
	Size       int64        `json:"size"`
	Digest     string       `json:"digest"`
	Details    modelDetails `json:"details"`
}

type modelDetails struct {
	ParentModel       string   `json:"parent_model"`
	Format            string   `json:"format"`
	Family            string   `json:"family"`
	Families          []string `json:"families"`
	ParameterSize     string   `json:"parameter_size"`
	QuantizationLevel string   `json:"quantization_level"`
}

func detailsOf(d contract.ModelDetails) modelDetails {
	return modelDetails{
		ParentModel: d.ParentModel, Format: d.Format, Family: d.Family, Families: d.Families,
		ParameterSize: d.ParameterSize, QuantizationLevel: d.QuantizationLevel,
	}
}

// representative returns the providers whose model server describes the
// model of info to Ollama clients: those serving the first of its targets
// that some live provider serves (an alias shows its first target's), and
// among them the first, by node then provider, whose node gave details (or
// the first). ok is false when no provider serves a target.
func representative(info contract.ModelInfo) (rep contract.ModelProvider, same []contract.ModelProvider, ok bool) {
	for _, t := range info.Targets {
		for _, p := range info.Providers {
			if modelname.Same(p.Target, t) {
				same = append(same, p)
			}
		}
		if len(same) > 0 {
			break
		}
	}
	if len(same) == 0 {
		return contract.ModelProvider{}, nil, false
	}
	rep = same[0]
	if i := slices.IndexFunc(same, func(p contract.ModelProvider) bool { return p.Details != nil }); i >= 0 {
		rep = same[i]
	}
	return rep, same, true
}

// listed returns the listing entry of name: what the representative
// provider's server said of it, when Config.Catalog is set and a node
// said something.
func (s *server) listed(name string) listedModel {
	sum := sha256.Sum256([]byte(name))
	m := listedModel{Name: name, Model: name, Digest: hex.EncodeToString(sum[:])}
	cat := s.cfg.Catalog
	if cat == nil {
		return m
	}
	info, ok := cat.ModelInfo(name)
	if !ok {
		return m
	}
	rep, _, ok := representative(info)
	if !ok || rep.Details == nil {
		return m
	}
	d := *rep.Details
	m.Size, m.ModifiedAt, m.Details = d.Size, d.ModifiedAt, detailsOf(d)
	if d.Digest != "" {
		m.Digest = d.Digest
	}
	return m
}

// tags serves GET /api/tags: {"models":[...]}, one entry per name of
// api.Frame.Models (the names /v1/models lists), each named with its tag as
// Ollama names them (ollamaName: "demo" is listed as "demo:latest", in
// "name" and "model"), all of them names /api/chat accepts, the most
// recently modified first (by the second, then by name). Each entry has
// the size, digest, modified_at and details its model server said
// (listed); modified_at is now when unknown.
func (s *server) tags(w http.ResponseWriter, r *http.Request) {
	names := s.f.Models(r)
	now := s.f.Now().UTC().Format(time.RFC3339Nano)
	models := make([]listedModel, 0, len(names))
	for _, name := range names {
		m := s.listed(name)
		m.Name = ollamaName(names, name)
		m.Model = m.Name
		if m.ModifiedAt == "" {
			m.ModifiedAt = now
		}
		models = append(models, m)
	}
	// As Ollama's ListHandler sorts: the most recently modified first, by
	// the second (within one, Ollama's order is its map's; here by name).
	seconds := func(m listedModel) int64 {
		at, _ := time.Parse(time.RFC3339Nano, m.ModifiedAt)
		return at.Unix()
	}
	slices.SortStableFunc(models, func(a, b listedModel) int { return cmp.Compare(seconds(b), seconds(a)) })
	writeJSON(w, http.StatusOK, map[string]any{"models": models})
}

// psModel is one entry of GET /api/ps: Ollama's fields
// (api.ProcessModelResponse, in its order, none left out), then iop's own.
type psModel struct {
	Name          string       `json:"name"`
	Model         string       `json:"model"`
	Size          int64        `json:"size"`
	Digest        string       `json:"digest"`
	Details       modelDetails `json:"details"`
	ExpiresAt     string       `json:"expires_at"`
	SizeVRAM      int64        `json:"size_vram"`
	ContextLength int64        `json:"context_length"`
	// iop's own: the node and provider that hold the model, where the
	// entry comes from (contract.LoadedModel.Source: "reported",
	// "always", "in_flight"), since when the node saw it loaded
	// ("reported" only), the runs of it in flight on that provider, and
	// whether an alias's keep_loaded keeps it.
	NodeID      string `json:"node_id"`
	ProviderID  string `json:"provider_id"`
	Source      string `json:"source"`
	LoadedSince string `json:"loaded_since,omitempty"`
	InFlight    int    `json:"in_flight"`
	Kept        bool   `json:"kept,omitempty"`
}

// ollamaForever is how far ahead /api/ps puts the expiry of a model held
// for good (an OpenAI-compatible provider's), as Ollama does for a model
// loaded with a negative keep_alive: the largest duration.
const ollamaForever = time.Duration(math.MaxInt64)

// ps serves GET /api/ps: {"models":[...]}, what the providers hold
// loaded (ModelCatalog.Loaded), one entry per provider and model that the
// request's key may use, longest expiry first (as Ollama sorts), then by
// name, node and provider. An entry an Ollama reported is its own /api/ps
// entry (name, model, size, size_vram, digest, details, expires_at,
// context_length); an OpenAI-compatible provider's models are always
// loaded (expires_at the far future, sizes 0 or the size on disk its node
// said); a model with runs in flight that its provider has not reported
// yet is listed with expires_at now and the details its node said. iop's
// fields say where each is (psModel).
func (s *server) ps(w http.ResponseWriter, r *http.Request) {
	models := []psModel{}
	cat := s.cfg.Catalog
	if cat == nil {
		writeJSON(w, http.StatusOK, map[string]any{"models": models})
		return
	}
	names := s.f.Models(r)
	now := s.f.Now().UTC()
	expiry := make(map[int]time.Time)
	for _, lm := range cat.Loaded() {
		if !api.Allowed(r, lm.Served) {
			continue
		}
		m := psModel{Name: lm.Name, Model: lm.Model, Size: lm.Size, Digest: lm.Digest, Details: detailsOf(lm.Details),
			ExpiresAt: lm.ExpiresAt, SizeVRAM: lm.SizeVRAM, ContextLength: lm.ContextLength,
			NodeID: lm.NodeID, ProviderID: lm.ProviderID, Source: lm.Source, LoadedSince: lm.LoadedSince, InFlight: lm.InFlight, Kept: lm.Kept}
		if lm.Source != contract.LoadedReported {
			m.Name = ollamaName(names, lm.Served)
			m.Model = m.Name
			if m.Digest == "" {
				sum := sha256.Sum256([]byte(lm.Served))
				m.Digest = hex.EncodeToString(sum[:])
			}
			at := now
			if lm.Source == contract.LoadedAlways {
				at = now.Add(ollamaForever)
			}
			m.ExpiresAt = at.Format(time.RFC3339Nano)
		}
		at, _ := time.Parse(time.RFC3339Nano, m.ExpiresAt)
		expiry[len(models)] = at
		models = append(models, m)
	}
	order := make([]int, len(models))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int {
		return cmp.Or(expiry[b].Compare(expiry[a]), cmp.Compare(models[a].Name, models[b].Name),
			cmp.Compare(models[a].NodeID, models[b].NodeID), cmp.Compare(models[a].ProviderID, models[b].ProviderID))
	})
	sorted := make([]psModel, len(models))
	for i, j := range order {
		sorted[i] = models[j]
	}
	writeJSON(w, http.StatusOK, map[string]any{"models": sorted})
}

// showProvider is one provider in /api/show's model_info.
type showProvider struct {
	NodeID       string   `json:"node_id"`
	ProviderID   string   `json:"provider_id"`
	Type         string   `json:"type"`
	Capabilities []string `json:"capabilities"`
	Healthy      bool     `json:"healthy"`
	Capacity     int      `json:"capacity"`
	InFlight     int      `json:"in_flight"`
}

// capabilityNames maps iop's capability words to Ollama's (the words
// of /api/show "capabilities" in Ollama's types/model/capability.go);
// others (stream, cancel, ...) have no Ollama name.
var capabilityNames = map[string]string{
	"completion": "completion", "tools": "tools", "vision": "vision", "embeddings": "embedding",
	"thinking": "thinking", "insert": "insert",
}

// show serves POST /api/show {"model"} (or the older {"name"};
// "verbose" as Ollama takes it). For a model whose representative
// providers (see representative: an alias shows its first target's)
// include one whose server speaks Ollama's API, the answer is that
// server's own (ModelShower: template, parameters, modelfile, tensors,
// details, model_info, capabilities, modified_at, license, ...), fetched
// through its node on demand, with paths of its host removed (the
// modelfile's FROM line names the served model; a parent_model that is a
// file path is ""); the first such provider, by node then provider, that
// answers 200 within the bound, trying at most two.
//
// Otherwise (a model of OpenAI-compatible or CLI providers, or no Ollama
// answered) it is iop's own view in Ollama's shape: empty modelfile,
// parameters and template; the details, modified_at and context length
// ("<family>.context_length" in model_info, beside
// "general.architecture") that the model server of its representative
// provider said; as capabilities, in Ollama's words, those of that target
// on every provider serving it ("completion" alone when none serves it);
// model_info also holds "iop.name", "iop.alias", "iop.targets" and
// "iop.providers". 400 for a body without a model, 404 (`model 'x' not
// found`, Ollama's text) for an unknown model.
func (s *server) show(w http.ResponseWriter, r *http.Request) {
	body, err := s.f.ReadAnyBody(r)
	if err != nil {
		s.writeError(w, r, err, nil)
		return
	}
	var in struct {
		Model   string `json:"model"`
		Name    string `json:"name"`
		Verbose bool   `json:"verbose"`
	}
	if err := json.Unmarshal(body, &in); err != nil {
		s.writeError(w, r, api.InvalidParam("", "the request body must be a JSON object with a string model"), nil)
		return
	}
	name := in.Model
	if name == "" {
		name = in.Name
	}
	req := &contract.Request{Model: name}
	if strings.TrimSpace(name) == "" {
		s.writeError(w, r, api.InvalidParam("", "model is required"), nil) // Ollama's text
		return
	}
	info := contract.ModelInfo{Name: name, Targets: []string{name}}
	if !api.Allowed(r, name) {
		s.writeError(w, r, contract.ErrUnknownModel, req)
		return
	}
	if cat := s.cfg.Catalog; cat != nil {
		var ok bool
		if info, ok = cat.ModelInfo(name); !ok {
			s.writeError(w, r, contract.ErrUnknownModel, req)
			return
		}
	} else if _, ok := api.KnownModel(s.f.Models(r), name); !ok {
		s.writeError(w, r, contract.ErrUnknownModel, req)
		return
	}
	providers := make([]showProvider, 0, len(info.Providers))
	for _, p := range info.Providers {
		providers = append(providers, showProvider{NodeID: p.NodeID, ProviderID: p.ProviderID, Type: p.Type,
			Capabilities: nonNil(p.Capabilities), Healthy: p.Healthy, Capacity: p.Capacity, InFlight: p.InFlight})
	}
	if _, same, ok := representative(info); ok && s.showFromOllama(w, r, same, in.Verbose) {
		return
	}
	caps := []string{}
	var d contract.ModelDetails // zero: the node said nothing
	if rep, same, ok := representative(info); ok {
		if rep.Details != nil {
			d = *rep.Details
		}
		for _, p := range same {
			for _, c := range p.Capabilities {
				if oc, ok := capabilityNames[c]; ok && !slices.Contains(caps, oc) {
					caps = append(caps, oc)
				}
			}
		}
	}
	if len(caps) == 0 {
		caps = append(caps, "completion")
	}
	modelInfo := map[string]any{
		"general.architecture": d.Family,
		"iop.name":             info.Name,
		"iop.alias":            info.Alias,
		"iop.targets":          nonNil(info.Targets),
		"iop.providers":        providers,
	}
	if d.Family != "" && d.ContextLength > 0 {
		modelInfo[d.Family+".context_length"] = d.ContextLength
	}
	modifiedAt := d.ModifiedAt
	if modifiedAt == "" {
		modifiedAt = s.f.Now().UTC().Format(time.RFC3339Nano)
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"modelfile":    "",
		"parameters":   "",
		"template":     "",
		"details":      detailsOf(d),
		"model_info":   modelInfo,
		"capabilities": caps,
		"modified_at":  modifiedAt,
	})
}

// maxShowTries is how many Ollama providers /api/show asks before it
// answers with iop's own view.
const maxShowTries = 2

// showFromOllama answers /api/show with what the Ollama server of one of
// providers (those serving the model's representative target, sorted by
// node then provider; healthy ones first) says of its target, when the
// Config.Shower is set and one of the first maxShowTries of them
// answers 200; it reports whether it answered. A failure is logged, and
// the caller answers instead.
func (s *server) showFromOllama(w http.ResponseWriter, r *http.Request, providers []contract.ModelProvider, verbose bool) bool {
	shower := s.cfg.Shower
	if shower == nil {
		return false
	}
	var ollamas []contract.ModelProvider
	for _, p := range providers {
		if p.OllamaAPI {
			ollamas = append(ollamas, p)
		}
	}
	slices.SortStableFunc(ollamas, func(a, b contract.ModelProvider) int {
		if a.Healthy == b.Healthy {
			return 0
		}
		if a.Healthy {
			return -1
		}
		return 1
	})
	for _, p := range ollamas[:min(len(ollamas), maxShowTries)] {
		status, body, err := shower.Show(r.Context(), p.NodeID, p.ProviderID, p.Target, verbose)
		if err == nil && status == http.StatusOK {
			w.Header().Set("Content-Type", jsonContentType)
			w.Header().Set("Content-Length", strconv.Itoa(len(body)))
			w.WriteHeader(http.StatusOK)
			_, _ = w.Write(body)
			return true
		}
		if errors.Is(err, context.Canceled) {
			return false
		}
		s.f.Logger().Warn("/api/show: the provider's Ollama gave no answer; trying the next, else answering iop's own view",
			"node", p.NodeID, "provider", p.ProviderID, "model", api.Clip(p.Target), "status", status, "err", err)
	}
	return false
}

// progress is one object of /api/pull's answer (Ollama's
// api.ProgressResponse).
type progress struct {
	Status    string `json:"status"`
	Digest    string `json:"digest,omitempty"`
	Total     int64  `json:"total,omitempty"`
	Completed int64  `json:"completed,omitempty"`
}

// pullNotFound is what Ollama's PullHandler answers for a model its
// registry does not have (pullModelManifest: the registry's 404 is
// os.ErrNotExist).
const pullNotFound = "pull model manifest: file does not exist"

// pull serves POST /api/pull {"model"} (or the older {"name"};
// "stream" true by default, "insecure" ignored) as Ollama's PullHandler
// answers it, for clients that pull a model before they use it (LangChain's
// ChatOllama with checkOrPullModel, Open WebUI, editor plugins). iop
// downloads nothing: its models are whatever its providers serve.
//
// For a model iop serves (a name /api/tags lists, with or without
// ":latest"; one the request's key may use) the answer is what Ollama
// answers for a model it already has: NDJSON progress objects
// {"status":"pulling manifest"}, {"status":"pulling <digest[7:19]>",
// "digest","total","completed"} (one layer: the digest and size its model
// server said, total = completed), {"status":"verifying sha256 digest"},
// {"status":"writing manifest"}, {"status":"success"}; with "stream":
// false only {"status":"success"}. For any other model it is Ollama's
// answer for a model its registry does not have: streamed,
// {"status":"pulling manifest"} then {"error":"pull model manifest: file
// does not exist"} (status 200: the stream had begun); with "stream":
// false, 500 {"error":"pull model manifest: file does not exist"}. A body
// that is not JSON, or names no model, is 400 as in Ollama ("invalid
// model name" for an empty name).
func (s *server) pull(w http.ResponseWriter, r *http.Request) {
	body, err := s.f.ReadAnyBody(r)
	if err != nil {
		s.writeError(w, r, err, nil)
		return
	}
	var in struct {
		Model  string `json:"model"`
		Name   string `json:"name"`
		Stream *bool  `json:"stream"`
	}
	if len(bytes.TrimSpace(body)) == 0 {
		s.writeError(w, r, api.InvalidParam("", "missing request body"), nil)
		return
	}
	if err := json.Unmarshal(body, &in); err != nil {
		s.writeError(w, r, api.InvalidParam("", "the request body must be a JSON object with a string model"), nil)
		return
	}
	name := in.Model
	if name == "" {
		name = in.Name
	}
	if strings.TrimSpace(name) == "" {
		s.writeError(w, r, api.InvalidParam("model", "invalid model name"), nil)
		return
	}
	stream := in.Stream == nil || *in.Stream
	api.AnswerFinished(r.Context()) // nothing is dispatched
	served, ok := api.KnownModel(s.f.Models(r), name)
	if !ok {
		if !stream {
			writeJSON(w, http.StatusInternalServerError, errorBody{Error: pullNotFound})
			return
		}
		w.Header().Set("Content-Type", ndjsonContentType)
		w.WriteHeader(http.StatusOK)
		writeNDJSON(w, progress{Status: "pulling manifest"}, errorBody{Error: pullNotFound})
		return
	}
	if !stream {
		writeJSON(w, http.StatusOK, progress{Status: "success"})
		return
	}
	m := s.listed(served)
	digest := "sha256:" + strings.TrimPrefix(m.Digest, "sha256:")
	w.Header().Set("Content-Type", ndjsonContentType)
	w.WriteHeader(http.StatusOK)
	writeNDJSON(w,
		progress{Status: "pulling manifest"},
		progress{Status: "pulling " + shortDigest(digest), Digest: digest, Total: m.Size, Completed: m.Size},
		progress{Status: "verifying sha256 digest"},
		progress{Status: "writing manifest"},
		progress{Status: "success"})
}

// shortDigest is the part of a "sha256:<hex>" digest Ollama's progress
// names a layer by: the hex's first 12 characters (digest[7:19]).
func shortDigest(digest string) string {
	hex := strings.TrimPrefix(digest, "sha256:")
	return hex[:min(12, len(hex))]
}

// writeNDJSON writes each value as one JSON line and flushes them. A
// failed write is the client's going: nothing more can be done.
func writeNDJSON(w http.ResponseWriter, values ...any) {
	for _, v := range values {
		b, err := json.Marshal(v)
		if err != nil {
			return
		}
		if _, err := w.Write(append(b, '\n')); err != nil {
			return
		}
	}
	_ = http.NewResponseController(w).Flush()
}

// nonNil returns s, or an empty slice for nil, so that it encodes as [].
func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
