package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"testing"
)

// Postgres creates and starts a throwaway PostgreSQL cluster in a
// temporary directory (Debian's binaries under /usr/lib/postgresql/*/bin,
// which `make test` installs) and returns its DSN (a Unix socket, user
// iop, database postgres); the cleanup stops it and removes the
// directory. PostgreSQL refuses to run as root, so as root the cluster
// belongs to the postgres user (Debian's package creates it) and every
// command runs through runuser. Missing binaries end the test through
// Missing. The run store and the usage ledger tests use it.
func Postgres(t testing.TB) string {
	t.Helper()
	bins, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	if len(bins) == 0 {
		Missing(t, "PostgreSQL binaries not found under /usr/lib/postgresql/*/bin: run `make test`, which installs Debian's postgresql package")
	}
	sort.Strings(bins)
	binDir := filepath.Dir(bins[len(bins)-1])
	dir, err := os.MkdirTemp("", "iop-pg-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	var prefix []string
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Fatalf("running as root needs the postgres user (Debian's postgresql package creates it; run `make test`): %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			t.Fatal(err)
		}
		// util-linux's runuser lives in /usr/sbin, which a user's PATH
		// may leave out.
		runuser, err := exec.LookPath("runuser")
		for _, p := range []string{"/usr/sbin/runuser", "/sbin/runuser"} {
			if err == nil {
				break
			}
			if _, serr := os.Stat(p); serr == nil {
				runuser, err = p, nil
			}
		}
		if err != nil {
			Missing(t, "running as root needs runuser (util-linux) to start PostgreSQL as the postgres user")
		}
		prefix = []string{runuser, "-u", "postgres", "--"}
	}
	run := func(args ...string) {
		t.Helper()
		args = append(prefix, args...)
		out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
		if err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
	}
	data, sock := filepath.Join(dir, "data"), filepath.Join(dir, "sock")
	run("mkdir", sock)
	run(filepath.Join(binDir, "initdb"), "-D", data, "-U", "iop", "--auth=trust", "-E", "UTF8", "--no-sync", "--no-instructions")
	// Unix socket only (no TCP port to collide with), no fsync: a test cluster.
	run(filepath.Join(binDir, "pg_ctl"), "start", "-w", "-t", "60", "-D", data, "-l", filepath.Join(dir, "log"),
		"-o", fmt.Sprintf("-k %s -c listen_addresses='' -c fsync=off -c full_page_writes=off", sock))
	t.Cleanup(func() { run(filepath.Join(binDir, "pg_ctl"), "stop", "-w", "-m", "fast", "-D", data) })
	return fmt.Sprintf("host=%s port=5432 user=iop dbname=postgres sslmode=disable", sock)
}
