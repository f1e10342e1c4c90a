package check

import (
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
)

const deployment = `# Source: iop/templates/edge.yaml
apiVersion: apps/v1
kind: Deployment
metadata:
  name: iop-edge
  labels: {app.kubernetes.io/name: iop}
spec:
  selector: {matchLabels: {app: iop}}
  template:
    metadata: {labels: {app: iop}}
    spec:
      containers:
        - name: edge
          image: iop:0.1.0
`

// TestDecodeRefusesWhatTheAPIServerWould proves the decoder strict: the
// good document decodes into an apps/v1 Deployment, and each broken
// variant (an unknown field, a field in another case, a duplicate key,
// an unknown kind, a name the API server refuses) is an error that names
// its template.
func TestDecodeRefusesWhatTheAPIServerWould(t *testing.T) {
	t.Parallel()
	objs, err := Decode([]byte("---\n# Source: iop/templates/empty.yaml\n---\n" + deployment))
	if err != nil {
		t.Fatal(err)
	}
	if len(objs) != 1 || objs[0].Kind != "Deployment" || objs[0].Name != "iop-edge" {
		t.Fatalf("decoded %+v", objs)
	}
	if d := objs[0].Object.(*appsv1.Deployment); d.Spec.Template.Spec.Containers[0].Image != "iop:0.1.0" {
		t.Errorf("image %q", d.Spec.Template.Spec.Containers[0].Image)
	}
	for _, tc := range []struct{ name, from, to, want string }{
		{"unknown field", "  selector:", "  replica: 1\n  selector:", `unknown field "spec.replica"`},
		{"unknown container field", "image: iop:0.1.0", "image: iop:0.1.0\n          readinesProbe: {}", `unknown field "spec.template.spec.containers[0].readinesProbe"`},
		{"field in another case", "image: iop", "Image: iop", `unknown field "spec.template.spec.containers[0].Image"`},
		{"duplicate key", "  name: iop-edge\n", "  name: iop-edge\n  name: iop-edge2\n", `key "name" already set`},
		{"unknown kind", "kind: Deployment", "kind: Deploymint", `no kind "Deploymint"`},
		{"invalid name", "name: iop-edge", "name: IOP_edge", "metadata.name"},
		{"invalid label", "app.kubernetes.io/name: iop}", "app.kubernetes.io/name: -iop}", "metadata.labels"},
	} {
		doc := strings.Replace(deployment, tc.from, tc.to, 1)
		if doc == deployment {
			t.Fatalf("%s: %q not in the document", tc.name, tc.from)
		}
		_, err := Decode([]byte(doc))
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "iop/templates/edge.yaml") {
			t.Errorf("%s: err %v, want one naming the template and %s", tc.name, err, tc.want)
		}
	}
}
