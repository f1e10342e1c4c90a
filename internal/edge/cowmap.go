package edge

import (
	"hash/maphash"
	"iter"
	"maps"
)

// cowShards is the number of shards of a cowMap; a write copies one
// shard and the array of shard pointers.
const cowShards = 64

var cowSeed = maphash.MakeSeed()

// cowMap is an immutable map from K to V, for state published behind an
// atomic.Pointer and read without a lock (the registry's state): with and
// without return a new map that shares every shard but the one they change
// with the old one, which stays as it was. A write costs O(n/64 + 64), so
// a map that grows with the nodes an edge has seen (gone nodes, model names
// no longer served) costs no O(n) copy per write. The zero value is empty.
type cowMap[K comparable, V any] struct {
	shards *[cowShards]map[K]V // nil: empty; neither the array nor a shard is modified once shared
	n      int
}

func cowShard[K comparable](k K) int { return int(maphash.Comparable(cowSeed, k) % cowShards) }

// get returns k's value and whether k is in m.
func (m cowMap[K, V]) get(k K) (V, bool) {
	if m.shards == nil {
		var zero V
		return zero, false
	}
	v, ok := m.shards[cowShard(k)][k]
	return v, ok
}

func (m cowMap[K, V]) len() int { return m.n }

// all yields m's entries, in no particular order.
func (m cowMap[K, V]) all() iter.Seq2[K, V] {
	return func(yield func(K, V) bool) {
		if m.shards == nil {
			return
		}
		for _, sh := range m.shards {
			for k, v := range sh {
				if !yield(k, v) {
					return
				}
			}
		}
	}
}

// with returns m with k set to v.
func (m cowMap[K, V]) with(k K, v V) cowMap[K, V] {
	i := cowShard(k)
	var out cowMap[K, V]
	out.shards = new([cowShards]map[K]V)
	if m.shards != nil {
		*out.shards = *m.shards
	}
	sh := make(map[K]V, len(out.shards[i])+1)
	maps.Copy(sh, out.shards[i])
	_, had := sh[k]
	sh[k] = v
	out.shards[i] = sh
	out.n = m.n
	if !had {
		out.n++
	}
	return out
}

// without returns m without k (m itself when k is not in it).
func (m cowMap[K, V]) without(k K) cowMap[K, V] {
	if _, ok := m.get(k); !ok {
		return m
	}
	i := cowShard(k)
	out := cowMap[K, V]{shards: new([cowShards]map[K]V), n: m.n - 1}
	*out.shards = *m.shards
	if len(m.shards[i]) == 1 {
		out.shards[i] = nil
	} else {
		sh := maps.Clone(m.shards[i])
		delete(sh, k)
		out.shards[i] = sh
	}
	return out
}
