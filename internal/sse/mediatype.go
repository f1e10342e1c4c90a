package sse

import "mime"

// IsEventStream reports whether contentType (a Content-Type header's
// value) names the media type text/event-stream, as mime.ParseMediaType
// reads it (case-insensitive, parameters allowed; a malformed value is
// not). A value that does not name event-stream anywhere (a JSON
// answer's) is told without parsing it (mime.ParseMediaType allocates its
// parameters' map), with the same result.
func IsEventStream(contentType string) bool {
	if !containsFold(contentType, "event-stream") {
		return false
	}
	mediaType, _, err := mime.ParseMediaType(contentType)
	return err == nil && mediaType == "text/event-stream"
}

// containsFold reports whether s may contain substr (lower-case ASCII
// letters and '-') under case folding, as mime.ParseMediaType lowers a
// media type: each byte is compared with its 0x20 bit set, which maps an
// upper-case letter to its lower case (and may match more, never less).
func containsFold(s, substr string) bool {
	for i := 0; i+len(substr) <= len(s); i++ {
		j := 0
		for j < len(substr) && s[i+j]|0x20 == substr[j] {
			j++
		}
		if j == len(substr) {
			return true
		}
	}
	return false
}
