package check

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// freePort returns a loopback port the system chose.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

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

// start runs a process until the test ends (SIGTERM, then wait) and
// prints its output when the test fails. The channel closes when the
// process exits.
func start(t *testing.T, name, dir string, bin string, args ...string) <-chan struct{} {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	out := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("--- %s %s\n%s", name, strings.Join(args, " "), out.String())
		}
	})
	return exited
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
// differs: loopback ports the system chose, given as flags after the
// chart's. The edge's readiness and liveness probes answer 200, and a
// client with the key of the values gets a chat answer; without it, 401.
func TestChartRuns(t *testing.T) {
	t.Parallel()
	h, bin := helm(t), iop(t)
	dir := t.TempDir()
	simPort, httpPort, nodePort := freePort(t), freePort(t), freePort(t)
	start(t, "sim", dir, bin, "sim", "--protocol", "ollama", "--listen", fmt.Sprintf("127.0.0.1:%d", simPort), "--model", "tiny")

	const key = "iop-chart-test-client-key"
	values := fmt.Sprintf(`secrets:
  keys: [{name: team-a, hash: "sha256:%x"}]
  nodeToken: chart-test-node-token
edge:
  config:
    models: {chat: {targets: [tiny]}}
nodes:
  providers: [{type: sim, protocol: ollama, base_url: "http://127.0.0.1:%d", capacity: 2}]
  config: {discovery_interval: 1s}
`, sha256.Sum256([]byte(key)), simPort)
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
	edgeExited := start(t, "edge", edgeDir, bin, append(edgeArgs,
		fmt.Sprintf("--listen=127.0.0.1:%d", httpPort), fmt.Sprintf("--node-listen=127.0.0.1:%d", nodePort))...)
	nodeArgs, nodeDir := pod(t, c, node, filepath.Join(dir, "node"), "prod-iop-node-7b9f8c6d5-q2w4e", "k8s-1")
	start(t, "node", nodeDir, bin, append(nodeArgs, fmt.Sprintf("--edge=127.0.0.1:%d", nodePort))...)

	base := fmt.Sprintf("http://127.0.0.1:%d", httpPort)
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
		case <-edgeExited:
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
	if code, body := chat(key); code != http.StatusOK || !strings.Contains(body, `"content"`) {
		t.Errorf("chat with the key: %d %s", code, body)
	}
	if code, body := chat(""); code != http.StatusUnauthorized {
		t.Errorf("chat without a key: %d %s, want 401", code, body)
	}
}
