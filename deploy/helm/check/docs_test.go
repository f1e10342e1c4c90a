package check

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

const deploymentDoc = "../../../docs/deployment.md"

// helmSection returns the fenced blocks of the "With Helm" section of
// docs/deployment.md: the YAML blocks by the file name the line before
// them gives (`values.yaml`:), and the lines of its sh blocks.
func helmSection(t *testing.T) (files map[string]string, commands []string) {
	t.Helper()
	data, err := os.ReadFile(deploymentDoc)
	if err != nil {
		t.Fatal(err)
	}
	files = map[string]string{}
	named := regexp.MustCompile("`([a-z-]+\\.yaml)`:$")
	in, fence, last, name := false, "", "", ""
	sc := bufio.NewScanner(strings.NewReader(string(data)))
	for sc.Scan() {
		l := sc.Text()
		switch {
		case strings.HasPrefix(l, "## "):
			in = l == "## With Helm"
		case !in:
		case fence == "" && strings.HasPrefix(l, "```"):
			fence = strings.TrimPrefix(l, "```")
			name = ""
			if m := named.FindStringSubmatch(last); fence == "yaml" && m != nil {
				name = m[1]
			}
		case fence != "" && l == "```":
			fence = ""
		case fence == "yaml" && name != "":
			files[name] += l + "\n"
		case fence == "sh":
			commands = append(commands, l)
		case strings.TrimSpace(l) != "":
			last = strings.TrimSpace(l)
		}
	}
	return files, commands
}

// TestChartDocs renders the chart as docs/deployment.md's Helm section
// installs it: its values files, its helm install and helm upgrade
// commands (as helm template, there being no cluster here), and checks
// each rendering as TestChart does; the Service its port-forward names
// exists.
func TestChartDocs(t *testing.T) {
	t.Parallel()
	h := helm(t)
	files, commands := helmSection(t)
	if files["values.yaml"] == "" || files["cluster-values.yaml"] == "" {
		t.Fatalf("the Helm section of %s shows no values.yaml and cluster-values.yaml: %v", deploymentDoc, files)
	}
	dir := t.TempDir()
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	chartPath, err := filepath.Abs(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	var rendered []chart
	for _, line := range commands {
		cmd, _, _ := strings.Cut(line, "#")
		f := strings.Fields(cmd)
		if len(f) < 4 || f[0] != "helm" || (f[1] != "install" && f[1] != "upgrade") {
			continue
		}
		args := []string{"template"}
		for _, a := range f[2:] {
			switch a {
			case "--create-namespace", "--wait", "--install":
			case "deploy/helm/iop":
				args = append(args, chartPath)
			default:
				args = append(args, a)
			}
		}
		c := exec.Command(h, args...)
		c.Dir = dir
		out, err := c.Output()
		if err != nil {
			t.Fatalf("%s (as helm %s): %v\n%s", cmd, strings.Join(args, " "), err, out)
		}
		objs, err := Decode(out)
		if err != nil {
			t.Fatalf("%s: %v", cmd, err)
		}
		if f[2] != "iop" {
			t.Fatalf("%s: release %q; this test knows the release iop", cmd, f[2])
		}
		rendered = append(rendered, chart{objs: objs, prefix: "iop", secrets: []string{"change-me", "SECRET"}})
	}
	if len(rendered) != 2 {
		t.Fatalf("%d helm install or upgrade commands in the Helm section, want the single edge's and the cluster's", len(rendered))
	}
	for i, c := range rendered {
		checkChart(t, c)
		if cluster := len(c.all("StatefulSet")) == 1; cluster != (i == 1) {
			t.Errorf("rendering %d: StatefulSet of edges %v", i, cluster)
		}
	}
	forward := regexp.MustCompile(`port-forward svc/(\S+)`)
	for _, line := range commands {
		if m := forward.FindStringSubmatch(line); m != nil {
			rendered[0].get(t, "Service", m[1])
		}
	}
}
