package browsertest

import (
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// Every headless Chromium the repository starts passes
// --disable-dev-shm-usage: in a container /dev/shm is 64 MB (Cloud Build's
// test step, Docker's default) and Chromium's renderer crashes or hangs
// there on a large page. The rule is checked where Chromium is started:
// every file that calls chromedp.NewExecAllocator.
func TestEveryChromiumDisablesDevShm(t *testing.T) {
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Dir(filepath.Dir(filepath.Dir(file)))
	found := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == ".state" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || path == file {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if strings.Contains(string(b), "chromedp.NewExecAllocator(") {
			found++
			if !strings.Contains(string(b), `chromedp.Flag("disable-dev-shm-usage", true)`) {
				t.Errorf("%s starts Chromium without --disable-dev-shm-usage", path)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if found < 2 {
		t.Errorf("found %d places that start Chromium; the check cannot see them", found)
	}
}
