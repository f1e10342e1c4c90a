// Package contract is the one contract between the edge core
// (internal/edge) and its HTTP API (internal/edge/api): what the API asks
// of the edge (Request), what comes back (DispatchInfo, the admin Snapshot,
// ModelInfo), the errors a dispatch fails with (ErrQueueFull, ...) and how
// a request ended (Outcome) and how its admission went (Admission,
// AdmissionOf: the one mapping of dispatch errors to admissions). Both
// packages use these types directly; no
// adapter converts them field by field.
//
// It depends on nothing of iop's: the wire protocol (wire/nodev1) and the
// scheduler stay behind the edge, which maps their values onto these
// (Operation, Path, ModelDetails; scheduler errors wrapped once at its
// boundary, see edge.Service.Dispatch).
//
// The name says what it is: the agreement both sides code against, the
// seam a follower edge (one that asks a remote scheduler) would implement
// again without touching the API.
//
// # Concurrency
//
// Values only: no goroutines, no locks (a LeaderBound is fixed once, by
// compare-and-swap). A Request's Body and slices belong
// to the caller of Dispatch until it returns; snapshots' slices are the
// caller's.
package contract
