package check

import (
	"bytes"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"
)

const (
	chartDir  = "../iop"
	release   = "prod"
	namespace = "llm"
	// What the test values sets hold as secrets: none may appear in a
	// ConfigMap or in a pod's arguments.
	secretMarker = "secret-"
	prefix       = release + "-iop"
)

// helm returns the helm binary: $IOP_HELM_BIN (make test sets it), else
// helm on PATH. Missing, the test is skipped, or fails with
// IOP_TEST_STRICT=1 (make test installs helm).
func helm(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("IOP_HELM_BIN"); p != "" {
		return p
	}
	if p, err := exec.LookPath("helm"); err == nil {
		return p
	}
	msg := "helm is not installed: `make helm` installs it (go install helm.sh/helm/v4/cmd/helm) into ~/.cache/iop; or set IOP_HELM_BIN"
	if os.Getenv("IOP_TEST_STRICT") == "1" {
		t.Fatal(msg + " (IOP_TEST_STRICT=1: make test installs it, so it must be there)")
	}
	t.Skip(msg)
	return ""
}

var iopBinary struct {
	once sync.Once
	path string
	out  []byte
	err  error
}

// iop returns an iop binary: $IOP_BIN (iop's deploy test sets it), else
// one built once from the repository's cmd/iop.
func iop(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("IOP_BIN"); p != "" {
		return p
	}
	iopBinary.once.Do(func() {
		dir, err := os.MkdirTemp("", "iop-helm-check-")
		if err != nil {
			iopBinary.err = err
			return
		}
		iopBinary.path = filepath.Join(dir, "iop")
		cmd := exec.Command("go", "build", "-o", iopBinary.path, "./cmd/iop")
		cmd.Dir = "../../.."
		iopBinary.out, iopBinary.err = cmd.CombinedOutput()
	})
	if iopBinary.err != nil {
		t.Fatalf("go build ./cmd/iop: %v\n%s", iopBinary.err, iopBinary.out)
	}
	return iopBinary.path
}

// run runs a command and returns its stdout; it fails the test with the
// command's stderr when the command fails.
func run(t *testing.T, name string, args ...string) []byte {
	t.Helper()
	cmd := exec.Command(name, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s%s", filepath.Base(name), strings.Join(args, " "), err, stderr.Bytes(), out)
	}
	return out
}

// chart is one rendering of the chart, decoded, with its objects by kind.
type chart struct {
	objs []Object
	// prefix starts every object's name: the release's and the chart's.
	prefix string
	// secrets are strings of the values that only Secrets may hold.
	secrets []string
}

func (c chart) all(kind string) []Object {
	var out []Object
	for _, o := range c.objs {
		if o.Kind == kind {
			out = append(out, o)
		}
	}
	return out
}

func (c chart) get(t *testing.T, kind, name string) Object {
	t.Helper()
	for _, o := range c.objs {
		if o.Kind == kind && o.Name == name {
			return o
		}
	}
	t.Fatalf("no %s %s rendered", kind, name)
	return Object{}
}

// kinds counts the rendered objects by kind.
func (c chart) kinds() map[string]int {
	n := map[string]int{}
	for _, o := range c.objs {
		n[o.Kind]++
	}
	return n
}

// workload is a Deployment, StatefulSet or DaemonSet seen through what
// they share.
type workload struct {
	kind, name string
	selector   *metav1.LabelSelector
	pod        corev1.PodTemplateSpec
}

func (c chart) workloads() []workload {
	var out []workload
	for _, o := range c.objs {
		switch w := o.Object.(type) {
		case *appsv1.Deployment:
			out = append(out, workload{o.Kind, o.Name, w.Spec.Selector, w.Spec.Template})
		case *appsv1.StatefulSet:
			out = append(out, workload{o.Kind, o.Name, w.Spec.Selector, w.Spec.Template})
		case *appsv1.DaemonSet:
			out = append(out, workload{o.Kind, o.Name, w.Spec.Selector, w.Spec.Template})
		}
	}
	return out
}

// render runs helm lint and helm template on the chart with a values
// file of testdata (none: the chart's values alone) and decodes every
// rendered object strictly.
func render(t *testing.T, values string) chart {
	t.Helper()
	h := helm(t)
	args := []string{"--namespace", namespace}
	if values != "" {
		args = append(args, "--values", filepath.Join("testdata", values+".yaml"))
	}
	run(t, h, append([]string{"lint", "--strict", chartDir}, args...)...)
	out := run(t, h, append([]string{"template", release, chartDir}, args...)...)
	objs, err := Decode(out)
	if err != nil {
		t.Fatal(err)
	}
	return chart{objs: objs, prefix: prefix, secrets: []string{secretMarker}}
}

// TestChart renders the chart with each values set, lints it, decodes
// every object strictly into the Kubernetes API types (Decode), and
// checks what every rendering promises (checkChart) and what each set
// adds.
func TestChart(t *testing.T) {
	t.Parallel()
	helm(t)
	tests := []struct {
		values string
		kinds  map[string]int
		check  func(t *testing.T, c chart)
	}{
		{"default", map[string]int{"Secret": 1, "ConfigMap": 2, "Service": 2, "PodDisruptionBudget": 1, "Deployment": 2}, checkDefault},
		{"cluster", map[string]int{"Secret": 2, "ConfigMap": 1, "Service": 2, "PodDisruptionBudget": 1, "StatefulSet": 1, "Deployment": 1}, checkCluster},
		{"daemonset", map[string]int{"Secret": 1, "ConfigMap": 2, "Service": 2, "PodDisruptionBudget": 1, "Deployment": 1, "DaemonSet": 1}, checkDaemonSet},
		{"servicemonitor", map[string]int{"Secret": 1, "ConfigMap": 2, "Service": 2, "PodDisruptionBudget": 1, "Deployment": 2, "ServiceMonitor": 1}, checkServiceMonitor},
		{"existing-secret", map[string]int{"ConfigMap": 2, "Service": 2, "PodDisruptionBudget": 1, "Deployment": 2}, checkExistingSecret},
	}
	for _, tc := range tests {
		t.Run(tc.values, func(t *testing.T) {
			t.Parallel()
			c := render(t, tc.values)
			if got := c.kinds(); !maps.Equal(got, tc.kinds) {
				t.Errorf("rendered %v, want %v", got, tc.kinds)
			}
			checkChart(t, c)
			tc.check(t, c)
		})
	}
}

// TestChartRefusesBadValues: the chart's values alone name no client key
// and no join token, and values.schema.json refuses a misspelt or
// mistyped value; helm refuses to render and says what to set.
func TestChartRefusesBadValues(t *testing.T) {
	t.Parallel()
	h := helm(t)
	for _, tc := range []struct {
		set  []string
		want string
	}{
		{nil, "set secrets.keys"},
		{[]string{"edge.insecureOpen=true"}, "set secrets.nodeToken"},
		{[]string{"secrets.existingSecret=x", "cluster.enabled=true"}, "cluster.enabled needs cluster.etcd"},
		{[]string{"secrets.existingSecret=x", "nodes.kind=StatefulSet"}, "at '/nodes/kind': value must be one of 'Deployment', 'DaemonSet'"},
		{[]string{"secrets.existingSecret=x", "nodes.knd=DaemonSet"}, "at '/nodes': additional properties 'knd' not allowed"},
		{[]string{"secrets.existingSecret=x", "cluster.replicas=1"}, "at '/cluster/replicas': minimum"},
		{[]string{"secrets.keys[0].name=a", "secrets.keys[0].hash=md5:0", "secrets.nodeToken=t"}, "at '/secrets/keys/0/hash'"},
	} {
		args := []string{"template", release, chartDir}
		for _, s := range tc.set {
			args = append(args, "--set", s)
		}
		out, err := exec.Command(h, args...).CombinedOutput()
		if err == nil || !strings.Contains(string(out), tc.want) {
			t.Errorf("helm template --set %v: err %v, want a refusal with %q:\n%s", tc.set, err, tc.want, out)
		}
	}
}

// checkChart checks what every rendering promises.
func checkChart(t *testing.T, c chart) {
	t.Helper()
	secrets := map[string]*corev1.Secret{}
	for _, o := range c.all("Secret") {
		secrets[o.Name] = o.Object.(*corev1.Secret)
	}
	configMaps := map[string]*corev1.ConfigMap{}
	for _, o := range c.all("ConfigMap") {
		cm := o.Object.(*corev1.ConfigMap)
		configMaps[o.Name] = cm
		for k, v := range cm.Data {
			if slices.ContainsFunc(c.secrets, func(s string) bool { return strings.Contains(v, s) }) {
				t.Errorf("ConfigMap %s holds a secret in %s:\n%s", o.Name, k, v)
			}
		}
	}
	ws := c.workloads()
	for _, w := range ws {
		checkPod(t, c, w, secrets, configMaps)
	}

	// The edges: probes, and a PDB and Services that select them.
	edge := findWorkload(t, ws, "edge")
	ct := edge.pod.Spec.Containers[0]
	for _, p := range []struct {
		probe *corev1.Probe
		path  string
	}{{ct.ReadinessProbe, "/readyz"}, {ct.LivenessProbe, "/healthz"}} {
		if p.probe == nil || p.probe.HTTPGet == nil || p.probe.HTTPGet.Path != p.path || p.probe.HTTPGet.Port.String() != "http" {
			t.Errorf("edge probe %+v, want GET %s on port http", p.probe, p.path)
		}
	}
	pdb := c.get(t, "PodDisruptionBudget", c.prefix+"-edge").Object.(*policyv1.PodDisruptionBudget)
	if !selects(t, pdb.Spec.Selector, edge.pod.Labels) || pdb.Spec.MaxUnavailable == nil {
		t.Errorf("PodDisruptionBudget %+v does not bound the edges' disruption", pdb.Spec)
	}
	for _, o := range c.all("Service") {
		svc := o.Object.(*corev1.Service)
		var target *workload
		for i := range ws {
			if labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(ws[i].pod.Labels)) && len(svc.Spec.Selector) > 0 {
				if target != nil {
					t.Errorf("Service %s selects both %s and %s", o.Name, target.name, ws[i].name)
				}
				target = &ws[i]
			}
		}
		if target == nil {
			t.Errorf("Service %s selects no pod", o.Name)
			continue
		}
		for _, p := range svc.Spec.Ports {
			if !slices.ContainsFunc(target.pod.Spec.Containers[0].Ports, func(cp corev1.ContainerPort) bool { return cp.Name == p.TargetPort.String() }) {
				t.Errorf("Service %s port %s targets %s, which %s does not have", o.Name, p.Name, p.TargetPort.String(), target.name)
			}
		}
	}
	headless := c.get(t, "Service", c.prefix+"-edge-headless").Object.(*corev1.Service)
	if headless.Spec.ClusterIP != "None" || !headless.Spec.PublishNotReadyAddresses {
		t.Error("the edges' headless Service must publish the addresses of edges not ready yet: an edge is ready only once a node is connected")
	}
	client := c.get(t, "Service", c.prefix+"-edge").Object.(*corev1.Service)
	if ports := servicePorts(client); !slices.Equal(ports, []string{"grpc", "http"}) {
		t.Errorf("edge Service ports %v, want http and grpc", ports)
	}

	// Every config file passes iop check, and the nodes dial the edges'
	// headless Service at its node port.
	dir := t.TempDir()
	var files []string
	for name, cm := range configMaps {
		for k, v := range cm.Data {
			files = append(files, writeConfig(t, dir, name, k, v))
		}
	}
	for name, s := range secrets {
		if strings.HasSuffix(name, "-edge-config") {
			for k, v := range s.StringData {
				files = append(files, writeConfig(t, dir, name, k, v))
			}
		}
		// The keys file has the shape of an edge file's keys and admin_keys.
		if v, ok := s.StringData["keys.yaml"]; ok {
			files = append(files, writeConfig(t, dir, name, "keys.yaml", v))
		}
	}
	if len(files) == 0 {
		t.Fatal("no config file rendered")
	}
	for _, f := range files {
		kind := "edge"
		if strings.Contains(f, "-node-config") {
			kind = "node"
		}
		if out, err := exec.Command(iop(t), "check", "--kind", kind, f).CombinedOutput(); err != nil {
			t.Errorf("iop check %s: %v\n%s", filepath.Base(f), err, out)
		}
	}
	if cm, ok := configMaps[c.prefix+"-node-config"]; ok {
		var node struct {
			Edge  string   `json:"edge"`
			Edges []string `json:"edges"`
		}
		if err := yaml.Unmarshal([]byte(cm.Data["node.yaml"]), &node); err != nil {
			t.Fatal(err)
		}
		want := fmt.Sprintf("%s.%s.svc.cluster.local:%d", headless.Name, namespace, headless.Spec.Ports[0].Port)
		if node.Edge != want && !slices.Equal(node.Edges, []string{want}) {
			t.Errorf("nodes dial edge %q edges %v, want %s", node.Edge, node.Edges, want)
		}
	}
}

// checkPod checks one workload's pod: non-root, read-only root, no
// privilege, the image from values, its selector matching its labels,
// every volume's ConfigMap or Secret rendered, every $(VAR) of its
// arguments defined, every secretKeyRef naming a key the Secret has.
func checkPod(t *testing.T, c chart, w workload, secrets map[string]*corev1.Secret, configMaps map[string]*corev1.ConfigMap) {
	t.Helper()
	spec := w.pod.Spec
	if !selects(t, w.selector, w.pod.Labels) {
		t.Errorf("%s %s: selector %v does not match its pods' labels %v", w.kind, w.name, w.selector, w.pod.Labels)
	}
	psc := spec.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.RunAsUser == nil || *psc.RunAsUser == 0 {
		t.Errorf("%s %s: pod securityContext %+v, want a non-root user", w.kind, w.name, psc)
	}
	if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
		t.Errorf("%s %s mounts a service account token it does not use", w.kind, w.name)
	}
	if len(spec.Containers) != 1 {
		t.Fatalf("%s %s: %d containers, want 1", w.kind, w.name, len(spec.Containers))
	}
	ct := spec.Containers[0]
	sc := ct.SecurityContext
	if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
		sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
		t.Errorf("%s %s: container securityContext %+v, want a read-only root, no privilege escalation, no capabilities", w.kind, w.name, sc)
	}
	if ct.Args[0] != ct.Name {
		t.Errorf("%s %s: args %v, want iop %s ...", w.kind, w.name, ct.Args, ct.Name)
	}
	env := map[string]bool{}
	for _, e := range ct.Env {
		env[e.Name] = true
		if r := e.ValueFrom; r != nil && r.SecretKeyRef != nil {
			if s, ok := secrets[r.SecretKeyRef.Name]; ok {
				if _, ok := s.StringData[r.SecretKeyRef.Key]; !ok {
					t.Errorf("%s %s: env %s wants key %s of Secret %s, which has %v", w.kind, w.name, e.Name, r.SecretKeyRef.Key, s.Name, slices.Sorted(maps.Keys(s.StringData)))
				}
			}
		}
	}
	for _, a := range ct.Args {
		if slices.ContainsFunc(c.secrets, func(s string) bool { return strings.Contains(a, s) }) {
			t.Errorf("%s %s: a secret in the arguments: %s", w.kind, w.name, a)
		}
		for _, v := range vars(a) {
			if !env[v] {
				t.Errorf("%s %s: argument %s names $(%s), which the container does not define (Kubernetes would pass it as is)", w.kind, w.name, a, v)
			}
		}
	}
	mounted := map[string]bool{}
	for _, m := range ct.VolumeMounts {
		mounted[m.Name] = true
	}
	writable := map[string]bool{}
	for _, v := range spec.Volumes {
		if !mounted[v.Name] {
			t.Errorf("%s %s: volume %s is not mounted", w.kind, w.name, v.Name)
		}
		switch {
		case v.ConfigMap != nil:
			if _, ok := configMaps[v.ConfigMap.Name]; !ok {
				t.Errorf("%s %s: volume %s: no ConfigMap %s rendered", w.kind, w.name, v.Name, v.ConfigMap.Name)
			}
		case v.Secret != nil:
			s, ok := secrets[v.Secret.SecretName]
			if !ok {
				if strings.HasPrefix(v.Secret.SecretName, c.prefix) {
					t.Errorf("%s %s: volume %s: no Secret %s rendered", w.kind, w.name, v.Name, v.Secret.SecretName)
				}
				continue
			}
			for _, it := range v.Secret.Items {
				if _, has := s.StringData[it.Key]; ok && !has {
					t.Errorf("%s %s: volume %s wants key %s of Secret %s", w.kind, w.name, v.Name, it.Key, s.Name)
				}
			}
		case v.EmptyDir != nil:
			writable[v.Name] = true
		}
	}
	for _, m := range ct.VolumeMounts {
		if m.MountPath == "/var/lib/iop" && !writable[m.Name] {
			t.Errorf("%s %s: /var/lib/iop (the working and state directory) is not writable", w.kind, w.name)
		}
	}
	if !slices.ContainsFunc(ct.VolumeMounts, func(m corev1.VolumeMount) bool { return m.MountPath == "/var/lib/iop" }) {
		t.Errorf("%s %s: no volume at /var/lib/iop, and the root file system is read-only", w.kind, w.name)
	}
}

// vars returns the names of the $(VAR) references of a container argument.
func vars(arg string) []string {
	var out []string
	for {
		_, rest, ok := strings.Cut(arg, "$(")
		if !ok {
			return out
		}
		name, after, ok := strings.Cut(rest, ")")
		if !ok {
			return out
		}
		out = append(out, name)
		arg = after
	}
}

func selects(t *testing.T, sel *metav1.LabelSelector, podLabels map[string]string) bool {
	t.Helper()
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		t.Fatal(err)
	}
	return !s.Empty() && s.Matches(labels.Set(podLabels))
}

func findWorkload(t *testing.T, ws []workload, component string) workload {
	t.Helper()
	for _, w := range ws {
		if w.pod.Labels["app.kubernetes.io/component"] == component {
			return w
		}
	}
	t.Fatalf("no %s workload rendered", component)
	return workload{}
}

func servicePorts(s *corev1.Service) []string {
	var out []string
	for _, p := range s.Spec.Ports {
		out = append(out, p.Name)
	}
	slices.Sort(out)
	return out
}

func writeConfig(t *testing.T, dir, object, key, data string) string {
	t.Helper()
	p := filepath.Join(dir, object+"."+key)
	if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// edgeConfig decodes the edge's config file named name.
func edgeConfig(t *testing.T, data string) map[string]any {
	t.Helper()
	var m map[string]any
	if err := yaml.Unmarshal([]byte(data), &m); err != nil {
		t.Fatal(err)
	}
	return m
}

func checkDefault(t *testing.T, c chart) {
	d := c.get(t, "Deployment", c.prefix+"-edge").Object.(*appsv1.Deployment)
	if *d.Spec.Replicas != 1 || d.Spec.Strategy.Type != appsv1.RecreateDeploymentStrategyType {
		t.Errorf("edge Deployment: %d replicas, strategy %s; want one edge, recreated (a second one would be a second leader)", *d.Spec.Replicas, d.Spec.Strategy.Type)
	}
	if img := d.Spec.Template.Spec.Containers[0].Image; img != "iop:0.1.0" {
		t.Errorf("edge image %q, want iop:0.1.0 (the chart's appVersion)", img)
	}
	cfg := edgeConfig(t, c.get(t, "ConfigMap", c.prefix+"-edge-config").Object.(*corev1.ConfigMap).Data["edge.yaml"])
	if cfg["keys_file"] != "/etc/iop/secret/keys.yaml" || cfg["listen"] != "0.0.0.0:8080" || cfg["insecure_open"] != nil {
		t.Errorf("edge.yaml %v: want the keys from the Secret, the API on every address, not open", cfg)
	}
	keys := c.get(t, "Secret", c.prefix+"-secrets").Object.(*corev1.Secret).StringData["keys.yaml"]
	if !strings.Contains(keys, "name: team-a") {
		t.Errorf("keys.yaml:\n%s", keys)
	}
	n := c.get(t, "Deployment", c.prefix+"-node").Object.(*appsv1.Deployment)
	if args := n.Spec.Template.Spec.Containers[0].Args; !slices.Contains(args, "--node-id=$(POD_NAME)") || !slices.Contains(args, "--token=$(IOP_NODE_TOKEN)") {
		t.Errorf("node args %v, want each pod its own node id and the token from the Secret", args)
	}
}

func checkCluster(t *testing.T, c chart) {
	s := c.get(t, "StatefulSet", c.prefix+"-edge").Object.(*appsv1.StatefulSet)
	if *s.Spec.Replicas != 3 || s.Spec.ServiceName != c.prefix+"-edge-headless" {
		t.Errorf("edge StatefulSet: %d replicas, service %s", *s.Spec.Replicas, s.Spec.ServiceName)
	}
	ct := s.Spec.Template.Spec.Containers[0]
	for _, want := range []string{"--config=/etc/iop/config/$(POD_NAME).yaml", "--runs-dsn=$(IOP_POSTGRES_DSN)", "--ledger-dsn=$(IOP_POSTGRES_DSN)"} {
		if !slices.Contains(ct.Args, want) {
			t.Errorf("edge args %v lack %s", ct.Args, want)
		}
	}
	files := c.get(t, "Secret", c.prefix+"-edge-config").Object.(*corev1.Secret).StringData
	if len(files) != 3 {
		t.Fatalf("%d edge config files, want one per edge", len(files))
	}
	for i := range 3 {
		name := fmt.Sprintf("%s-edge-%d", c.prefix, i)
		cfg := edgeConfig(t, files[name+".yaml"])
		cl, _ := cfg["cluster"].(map[string]any)
		want := map[string]any{
			"name":        name,
			"advertise":   fmt.Sprintf("%s.%s-edge-headless.%s.svc.cluster.local:7071", name, c.prefix, namespace),
			"listen":      "0.0.0.0:7071",
			"id":          "prod",
			"token":       "secret-cluster-token-c0de",
			"session_ttl": "3s",
			"tls_cert":    "/etc/iop/tls/tls.crt",
			"etcd":        []any{"http://etcd-0.etcd:2379", "http://etcd-1.etcd:2379", "http://etcd-2.etcd:2379"},
		}
		for k, v := range want {
			if fmt.Sprint(cl[k]) != fmt.Sprint(v) {
				t.Errorf("%s: cluster.%s = %v, want %v", name, k, cl[k], v)
			}
		}
		if m, _ := cfg["models"].(map[string]any); m["chat"] == nil {
			t.Errorf("%s: the models of edge.config are missing: %v", name, cfg)
		}
	}
	if node := c.get(t, "ConfigMap", c.prefix+"-node-config").Object.(*corev1.ConfigMap).Data["node.yaml"]; !strings.Contains(node, "resolve_interval: 5s") {
		t.Errorf("node.yaml does not look the edges up again soon (a restarted edge is ready only once a node finds it):\n%s", node)
	}
	if !slices.ContainsFunc(ct.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == "tls" && m.MountPath == "/etc/iop/tls" }) {
		t.Errorf("edge mounts %v, want edge.extraVolumeMounts' /etc/iop/tls", ct.VolumeMounts)
	}
	if !slices.ContainsFunc(s.Spec.Template.Spec.Containers[0].Ports, func(p corev1.ContainerPort) bool { return p.Name == "cluster" && p.ContainerPort == 7071 }) {
		t.Error("the edges do not expose their admission service")
	}
}

func checkDaemonSet(t *testing.T, c chart) {
	d := c.get(t, "DaemonSet", c.prefix+"-node").Object.(*appsv1.DaemonSet)
	spec := d.Spec.Template.Spec
	ct := spec.Containers[0]
	if ct.Image != "registry.example.com/iop:1.2.3" || ct.ImagePullPolicy != corev1.PullAlways || len(spec.ImagePullSecrets) != 1 {
		t.Errorf("node image %s (%s, pull secrets %v), want the one of values", ct.Image, ct.ImagePullPolicy, spec.ImagePullSecrets)
	}
	if !slices.Contains(ct.Args, "--node-id=$(NODE_NAME)") || !spec.HostNetwork || spec.DNSPolicy != corev1.DNSClusterFirstWithHostNet {
		t.Errorf("node: args %v, host network %v, DNS %s; want the host's name as node id and the host's network", ct.Args, spec.HostNetwork, spec.DNSPolicy)
	}
	if spec.NodeSelector["nvidia.com/gpu.present"] != "true" || len(spec.Tolerations) != 1 || ct.Resources.Limits.Memory().String() != "256Mi" {
		t.Errorf("node scheduling %v %v %v", spec.NodeSelector, spec.Tolerations, ct.Resources)
	}
	if !slices.ContainsFunc(ct.Env, func(e corev1.EnvVar) bool {
		return e.Name == "VLLM_API_KEY" && e.ValueFrom.SecretKeyRef.Name == "vllm"
	}) {
		t.Errorf("node env %v lacks the provider's key", ct.Env)
	}
	if e := c.get(t, "Deployment", c.prefix+"-edge").Object.(*appsv1.Deployment); e.Spec.Template.Spec.Containers[0].Image != ct.Image {
		t.Error("edge and node run different images")
	}
	node := c.get(t, "ConfigMap", c.prefix+"-node-config").Object.(*corev1.ConfigMap).Data["node.yaml"]
	for _, want := range []string{"api_key_env: VLLM_API_KEY", "discovery_interval: 10s", "base_url: http://127.0.0.1:11434"} {
		if !strings.Contains(node, want) {
			t.Errorf("node.yaml lacks %q:\n%s", want, node)
		}
	}
}

func checkServiceMonitor(t *testing.T, c chart) {
	sm := c.get(t, "ServiceMonitor", c.prefix+"-edge").Object.(*monitoringv1.ServiceMonitor)
	client := c.get(t, "Service", c.prefix+"-edge").Object.(*corev1.Service)
	headless := c.get(t, "Service", c.prefix+"-edge-headless").Object.(*corev1.Service)
	if !selects(t, &sm.Spec.Selector, client.Labels) || selects(t, &sm.Spec.Selector, headless.Labels) {
		t.Errorf("ServiceMonitor selector %v: want the edge Service %v alone, not %v", sm.Spec.Selector, client.Labels, headless.Labels)
	}
	if sm.Labels["release"] != "prometheus" || !slices.Equal(sm.Spec.NamespaceSelector.MatchNames, []string{namespace}) {
		t.Errorf("ServiceMonitor labels %v, namespaces %v", sm.Labels, sm.Spec.NamespaceSelector)
	}
	if len(sm.Spec.Endpoints) != 1 {
		t.Fatalf("%d endpoints", len(sm.Spec.Endpoints))
	}
	ep := sm.Spec.Endpoints[0]
	if ep.Port != "http" || ep.Path != "/metrics" || ep.Interval != "15s" {
		t.Errorf("endpoint %+v, want /metrics on http every 15s", ep)
	}
	if a := ep.Authorization; a == nil || a.Credentials == nil || a.Credentials.Name != "iop-prometheus" || a.Credentials.Key != "admin-key" {
		t.Errorf("endpoint authorization %+v, want the admin key's Secret", ep.Authorization)
	}
}

func checkExistingSecret(t *testing.T, c chart) {
	d := c.get(t, "Deployment", c.prefix+"-edge").Object.(*appsv1.Deployment)
	var refs []string
	for _, e := range d.Spec.Template.Spec.Containers[0].Env {
		if r := e.ValueFrom; r != nil && r.SecretKeyRef != nil {
			refs = append(refs, r.SecretKeyRef.Name+"/"+r.SecretKeyRef.Key)
		}
	}
	for _, v := range d.Spec.Template.Spec.Volumes {
		if v.Secret != nil {
			refs = append(refs, v.Secret.SecretName+"/"+v.Secret.Items[0].Key)
		}
	}
	slices.Sort(refs)
	if want := []string{"iop-credentials/keys.yaml", "iop-credentials/node-token", "iop-credentials/postgres-dsn"}; !slices.Equal(refs, want) {
		t.Errorf("the edge reads %v, want %v", refs, want)
	}
}
