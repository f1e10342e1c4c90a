package nodev1

// Welcome features (Welcome.features in node.proto): what an edge reads
// beyond the first version of the protocol. A node uses a feature only
// with an edge that named it, so nodes may be upgraded before their edges.
const (
	// FeatureTunnelHeadBody: the edge reads TunnelHead's data, end and
	// content_length. Without it a node sends a head's body as TunnelData
	// and its end as a TunnelEnd: an older edge ignores those fields and
	// would lose the body they carry.
	FeatureTunnelHeadBody = "tunnel_head_body"
)
