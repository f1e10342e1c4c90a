package check

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

// Object is one decoded document of a rendered chart.
type Object struct {
	// Source is the template that rendered it (helm's "# Source:" line).
	Source string
	// Object is the typed object: *corev1.ConfigMap, *appsv1.Deployment,
	// *monitoringv1.ServiceMonitor, ...
	Object runtime.Object
	// Kind and Name identify it, e.g. "Deployment", "iop-edge".
	Kind, Name string
}

// scheme knows the API groups the chart may render: core, apps, policy
// and the Prometheus Operator's monitoring.coreos.com/v1.
var scheme = func() *runtime.Scheme {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, appsv1.AddToScheme, policyv1.AddToScheme, monitoringv1.AddToScheme} {
		if err := add(s); err != nil {
			panic(err)
		}
	}
	return s
}()

// strict is the API machinery's own YAML deserializer in strict mode: an
// unknown field, a duplicate field or a field written in another case is
// an error, as kubectl apply --validate=strict makes it.
var strict = serializer.NewCodecFactory(scheme, serializer.EnableStrict).UniversalDeserializer()

// Decode splits a multi-document YAML stream (helm template's output) and
// decodes every non-empty document strictly into its Kubernetes type. It
// fails on the first document that does not decode, of a kind the scheme
// does not know, or whose name or labels Kubernetes would refuse; the
// error names the document's template.
func Decode(stream []byte) ([]Object, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(stream)))
	var objs []Object
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return objs, nil
		}
		if err != nil {
			return nil, err
		}
		src := source(doc)
		if empty(doc) {
			continue
		}
		obj, gvk, err := strict.Decode(doc, nil, nil)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", src, err)
		}
		m, err := meta.Accessor(obj)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", src, err)
		}
		if errs := validateMeta(gvk.Kind, m.GetName(), m.GetLabels()); len(errs) > 0 {
			return nil, fmt.Errorf("%s: %s %q: %w", src, gvk.Kind, m.GetName(), errs.ToAggregate())
		}
		objs = append(objs, Object{Source: src, Object: obj, Kind: gvk.Kind, Name: m.GetName()})
	}
}

// validateMeta checks a name and labels as the API server would: a
// Service's name is a DNS-1035 label, other names DNS-1123 subdomains.
func validateMeta(kind, name string, labels map[string]string) field.ErrorList {
	var errs field.ErrorList
	check := validation.IsDNS1123Subdomain
	if kind == "Service" {
		check = validation.IsDNS1035Label
	}
	for _, msg := range check(name) {
		errs = append(errs, field.Invalid(field.NewPath("metadata", "name"), name, msg))
	}
	return append(errs, metav1validation.ValidateLabels(labels, field.NewPath("metadata", "labels"))...)
}

func source(doc []byte) string {
	for line := range strings.SplitSeq(string(doc), "\n") {
		if s, ok := strings.CutPrefix(line, "# Source: "); ok {
			return s
		}
	}
	return "(no # Source line)"
}

// empty reports whether a document holds only comments and blank lines.
func empty(doc []byte) bool {
	for line := range strings.SplitSeq(string(doc), "\n") {
		if t := strings.TrimSpace(line); t != "" && t != "---" && !strings.HasPrefix(t, "#") {
			return false
		}
	}
	return true
}
