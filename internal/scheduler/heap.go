package scheduler

// waitRef places one waiter in one resource's heap.
type waitRef struct {
	w     *waiter
	res   *resource
	index int // position in the heap, kept by the heap operations
}

// waitHeap is a binary min-heap of waiters in queue order (waiter.before:
// priority band, start tag, enqueue sequence): the first waiter listing a
// resource is at the top. Push and remove cost O(log n).
type waitHeap []*waitRef

func (h waitHeap) peek() *waiter {
	if len(h) == 0 {
		return nil
	}
	return h[0].w
}

func (h *waitHeap) push(ref *waitRef) {
	ref.index = len(*h)
	*h = append(*h, ref)
	h.up(ref.index)
}

func (h *waitHeap) remove(ref *waitRef) {
	i, last := ref.index, len(*h)-1
	if i != last {
		h.swap(i, last)
	}
	(*h)[last] = nil
	*h = (*h)[:last]
	if i != last {
		if !h.down(i) {
			h.up(i)
		}
	}
	ref.index = -1
}

func (h waitHeap) less(i, j int) bool { return h[i].w.before(h[j].w) }

func (h waitHeap) swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index = i
	h[j].index = j
}

func (h waitHeap) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !h.less(i, p) {
			return
		}
		h.swap(i, p)
		i = p
	}
}

// down sifts i down and reports whether it moved.
func (h waitHeap) down(i int) bool {
	start := i
	for {
		l := 2*i + 1
		if l >= len(h) {
			break
		}
		m := l
		if r := l + 1; r < len(h) && h.less(r, l) {
			m = r
		}
		if !h.less(m, i) {
			break
		}
		h.swap(i, m)
		i = m
	}
	return i > start
}
