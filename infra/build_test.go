package infra

import (
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestFunctionsBuildStatic builds every function's command as the
// Dockerfile does (CGO_ENABLED=0, linux/amd64) and checks the binary is
// static: no program interpreter, no shared libraries.
func TestFunctionsBuildStatic(t *testing.T) {
	root := repoRoot(t)
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command on PATH")
	}
	for _, f := range functionNames(t) {
		t.Run(f, func(t *testing.T) {
			pkg := filepath.Join(root, "functions", f, "cmd")
			goFiles, _ := filepath.Glob(filepath.Join(pkg, "*.go"))
			if len(goFiles) == 0 {
				t.Fatalf("functions/%s/cmd has no Go files: every function ships a command", f)
			}
			out := filepath.Join(t.TempDir(), f)
			cmd := exec.Command(goBin, "build", "-trimpath", "-o", out, "./functions/"+f+"/cmd")
			cmd.Dir = root
			cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
			if b, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("go build ./functions/%s/cmd: %v\n%s", f, err, b)
			}
			bin, err := elf.Open(out)
			if err != nil {
				t.Fatalf("%s is not an ELF binary: %v", f, err)
			}
			defer bin.Close()
			if bin.Machine != elf.EM_X86_64 || bin.Type != elf.ET_EXEC {
				t.Errorf("%s: machine %v, type %v; want x86-64 executable", f, bin.Machine, bin.Type)
			}
			for _, p := range bin.Progs {
				if p.Type == elf.PT_INTERP {
					t.Errorf("%s has a program interpreter: it is dynamically linked", f)
				}
			}
			if libs, _ := bin.ImportedLibraries(); len(libs) > 0 {
				t.Errorf("%s needs shared libraries %s", f, strings.Join(libs, ", "))
			}
		})
	}
}
