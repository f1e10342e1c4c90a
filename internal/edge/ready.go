package edge

// Ready reports whether this edge can serve requests now, for /readyz: at
// least one node is connected, and with several edges a scheduler leader
// answers (this edge leads an epoch it has rebuilt, or its admission
// session with the current leader is open). It takes no lock of the
// scheduler and never blocks.
func (s *Service) Ready() bool {
	nodes := false
	for range s.reg.load().nodes.all() {
		nodes = true
		break
	}
	if !nodes {
		return false
	}
	select {
	case <-s.shutdown:
		return false
	default:
	}
	return s.adm.serving()
}

// serving reports whether a leader admits for this edge now: its own,
// rebuilt, or one it holds an admission session with.
func (cm *clusterMode) serving() bool {
	st := cm.el.State()
	if st.Leader {
		return cm.leadsReady() == st.Epoch
	}
	return st.Epoch != 0 && cm.session.Load() == st.Epoch
}
