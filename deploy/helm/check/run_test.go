package check

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// syncBuffer is a process's output, written by exec's copier and read by
// the test.
type syncBuffer struct {
	mu sync.Mutex // guards b
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// proc is a process a test started.
type proc struct {
	name   string
	out    *syncBuffer
	exited chan struct{}
}

// start runs a process until the test ends (SIGTERM, then wait) and
// prints its output when the test fails.
func start(t *testing.T, name, dir string, bin string, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	p := &proc{name: name, out: &syncBuffer{}, exited: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.out, p.out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = cmd.Wait(); close(p.exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.exited:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-p.exited
		}
		if t.Failed() {
			t.Logf("--- %s %s\n%s", name, strings.Join(args, " "), p.out.String())
		}
	})
	return p
}

// waitFor waits up to 60 s for a line of the process's output that re
// matches, and returns re's submatches; the process exiting first fails
// the test.
func (p *proc) waitFor(t *testing.T, re *regexp.Regexp) []string {
	t.Helper()
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if m := re.FindStringSubmatch(p.out.String()); m != nil {
			return m
		}
		select {
		case <-p.exited:
			t.Fatalf("%s exited before it printed %s", p.name, re)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s printed no %s in 60 s", p.name, re)
		}
	}
}

// pod lays out one workload's pod as its container would see it, under
// root: every volume's ConfigMap or Secret files at their mount paths,
// every emptyDir made. Paths in the files and the arguments move under
// root too; $(VAR) in the arguments is expanded as the kubelet does,
// from the container's env (fieldRefs: podName, nodeName). It returns
// the arguments and the working directory (the image's, /var/lib/iop).
func pod(t *testing.T, c chart, w workload, root, podName, nodeName string) (args []string, workdir string) {
	t.Helper()
	ct := w.pod.Spec.Containers[0]
	secrets := map[string]*corev1.Secret{}
	for _, o := range c.all("Secret") {
		secrets[o.Name] = o.Object.(*corev1.Secret)
	}
	configMaps := map[string]*corev1.ConfigMap{}
	for _, o := range c.all("ConfigMap") {
		configMaps[o.Name] = o.Object.(*corev1.ConfigMap)
	}
	var moves []string
	for _, m := range ct.VolumeMounts {
		moves = append(moves, m.MountPath, filepath.Join(root, m.MountPath))
	}
	move := strings.NewReplacer(moves...)
	volumes := map[string]corev1.Volume{}
	for _, v := range w.pod.Spec.Volumes {
		volumes[v.Name] = v
	}
	for _, m := range ct.VolumeMounts {
		dir := filepath.Join(root, m.MountPath)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		files := map[string]string{}
		var items []corev1.KeyToPath
		switch v := volumes[m.Name]; {
		case v.ConfigMap != nil:
			files, items = configMaps[v.ConfigMap.Name].Data, v.ConfigMap.Items
		case v.Secret != nil:
			files, items = secrets[v.Secret.SecretName].StringData, v.Secret.Items
		}
		if len(items) > 0 {
			picked := map[string]string{}
			for _, it := range items {
				picked[it.Path] = files[it.Key]
			}
			files = picked
		}
		for name, data := range files {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(move.Replace(data)), 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	env := map[string]string{}
	for _, e := range ct.Env {
		switch r := e.ValueFrom; {
		case r == nil:
			env[e.Name] = e.Value
		case r.FieldRef != nil && r.FieldRef.FieldPath == "metadata.name":
			env[e.Name] = podName
		case r.FieldRef != nil && r.FieldRef.FieldPath == "spec.nodeName":
			env[e.Name] = nodeName
		case r.SecretKeyRef != nil:
			env[e.Name] = secrets[r.SecretKeyRef.Name].StringData[r.SecretKeyRef.Key]
		}
	}
	var expand []string
	for k, v := range env {
		expand = append(expand, "$("+k+")", v)
	}
	vars := strings.NewReplacer(expand...)
	for _, a := range ct.Args {
		args = append(args, move.Replace(vars.Replace(a)))
	}
	return args, filepath.Join(root, "/var/lib/iop")
}

// TestChartRuns runs what the chart renders: the edge's and the node's
// containers as iop processes with the rendered arguments, environment
// (the join token from the Secret) and files (config from the
// ConfigMaps, keys.yaml from the Secret) laid out at their mount paths
// under a temporary root, the node driving an iop sim. Only the network
// differs: loopback ports the system chose (:0), given as flags after
// the chart's. The edge's readiness and liveness probes answer 200, and a
// client with the key of the values gets a chat answer; without it, 401.
func TestChartRuns(t *testing.T) {
	t.Parallel()
	h, bin := helm(t), iop(t)
	dir := t.TempDir()
	sim := start(t, "sim", dir, bin, "sim", "--protocol", "ollama", "--listen", "127.0.0.1:0", "--model", "tiny")
	simURL := "http://" + sim.waitFor(t, regexp.MustCompile(`msg=serving .*addr=(\S+)`))[1]

	const key = "iop-chart-test-client-key"
	values := fmt.Sprintf(`secrets:
  keys: [{name: team-a, hash: "sha256:%x"}]
  nodeToken: chart-test-node-token
edge:
  config:
    models: {chat: {targets: [tiny]}}
nodes:
  providers: [{type: sim, protocol: ollama, base_url: "%s", capacity: 2}]
  config: {discovery_interval: 1s}
`, sha256.Sum256([]byte(key)), simURL)
	vf := filepath.Join(dir, "values.yaml")
	if err := os.WriteFile(vf, []byte(values), 0o644); err != nil {
		t.Fatal(err)
	}
	objs, err := Decode(run(t, h, "template", release, chartDir, "--namespace", namespace, "--values", vf))
	if err != nil {
		t.Fatal(err)
	}
	c := chart{objs: objs, prefix: prefix}
	ws := c.workloads()
	edge, node := findWorkload(t, ws, "edge"), findWorkload(t, ws, "node")

	edgeArgs, edgeDir := pod(t, c, edge, filepath.Join(dir, "edge"), "prod-iop-edge-6d4cf56db-x7k2p", "k8s-1")
	e := start(t, "edge", edgeDir, bin, append(edgeArgs, "--listen=127.0.0.1:0", "--node-listen=127.0.0.1:0")...)
	addrs := e.waitFor(t, regexp.MustCompile(`msg="edge ready" http=(\S+) node_endpoint=(\S+)`))
	base, nodeEndpoint := addrs[1], addrs[2]
	nodeArgs, nodeDir := pod(t, c, node, filepath.Join(dir, "node"), "prod-iop-node-7b9f8c6d5-q2w4e", "k8s-1")
	start(t, "node", nodeDir, bin, append(nodeArgs, "--edge="+nodeEndpoint)...)

	ct := edge.pod.Spec.Containers[0]
	get := func(path string) int {
		resp, err := http.Get(base + path)
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	ready := ct.ReadinessProbe.HTTPGet.Path
	for deadline := time.Now().Add(90 * time.Second); get(ready) != http.StatusOK; time.Sleep(200 * time.Millisecond) {
		select {
		case <-e.exited:
			t.Fatal("the edge exited")
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET %s: %d after 90 s, want 200 once the node is connected", ready, get(ready))
		}
	}
	if code := get(ct.LivenessProbe.HTTPGet.Path); code != http.StatusOK {
		t.Errorf("GET %s: %d", ct.LivenessProbe.HTTPGet.Path, code)
	}

	chat := func(bearer string) (int, string) {
		req, err := http.NewRequest("POST", base+"/v1/chat/completions",
			strings.NewReader(`{"model":"chat","messages":[{"role":"user","content":"Hello!"}]}`))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		if bearer != "" {
			req.Header.Set("Authorization", "Bearer "+bearer)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	// Ready means a node is connected; its provider's models may come a
	// moment later (discovery): until then the answer is 503, retry later.
	code, body := chat(key)
	for deadline := time.Now().Add(60 * time.Second); code == http.StatusServiceUnavailable && time.Now().Before(deadline); code, body = chat(key) {
		time.Sleep(100 * time.Millisecond)
	}
	if code != http.StatusOK || !strings.Contains(body, `"content"`) {
		t.Errorf("chat with the key: %d %s", code, body)
	}
	if code, body := chat(""); code != http.StatusUnauthorized {
		t.Errorf("chat without a key: %d %s, want 401", code, body)
	}
}
