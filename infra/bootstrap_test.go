package infra

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// docSection returns a document's text from the heading that starts with
// title up to the next heading of the same or a higher level.
func docSection(t testing.TB, file, title string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot(t), file))
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	i := strings.Index(s, "\n"+title)
	if i < 0 {
		t.Fatalf("%s has no heading %q", file, title)
	}
	level := strings.Index(title, " ")
	rest := s[i+1+len(title):]
	end := len(rest)
	// A heading outside code blocks (a shell comment is no heading).
	inFence := func(at int) bool { return strings.Count(rest[:at], "```")%2 == 1 }
	for _, m := range regexp.MustCompile(`(?m)^(#+) `).FindAllStringSubmatchIndex(rest, -1) {
		if m[3]-m[2] <= level && !inFence(m[0]) {
			end = m[0]
			break
		}
	}
	return rest[:end]
}

// shellCommands returns the commands of the ```sh blocks of a text, each
// on one line (backslash continuations joined), comments dropped.
func shellCommands(text string) []string {
	var out []string
	for _, m := range regexp.MustCompile("(?s)```sh\n(.*?)```").FindAllStringSubmatch(text, -1) {
		joined := strings.ReplaceAll(m[1], "\\\n", " ")
		for _, line := range strings.Split(joined, "\n") {
			line = strings.TrimSpace(line)
			if line == "" || strings.HasPrefix(line, "#") {
				continue
			}
			out = append(out, strings.Join(strings.Fields(line), " "))
		}
	}
	return out
}

// TestBuildSourceIsReadableByTheBuildAccount: the deploy guide's path from
// a fresh project stages each build's source in a bucket the build's own
// service account may read. gcloud builds submit uploads the source to
// gs://<project>_cloudbuild by default and Cloud Build fetches it as the
// build's service account; a user-specified account has no rights there,
// so the first build failed at FETCHSOURCE with a 403. The path creates
// the staging bucket, grants each build account an object reader role on
// it, and submits with --gcs-source-staging-dir in it; each configuration's
// by-hand command says the same.
func TestBuildSourceIsReadableByTheBuildAccount(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(repoRoot(t), "docs", "deploying.md"))
	if err != nil {
		t.Fatal(err)
	}
	cmds := shellCommands(string(b))
	readers := map[string]bool{"roles/storage.objectViewer": true, "roles/storage.objectAdmin": true, "roles/storage.objectUser": true, "roles/storage.admin": true}
	submits := map[string]string{}
	for _, c := range cmds {
		if !strings.HasPrefix(c, "gcloud builds submit ") {
			continue
		}
		config := regexp.MustCompile(`--config (\S+)`).FindStringSubmatch(c)
		if config == nil {
			t.Fatalf("a submit without --config: %s", c)
		}
		submits[config[1]] = c
	}
	if len(submits) != 2 || submits["cloudbuild.yaml"] == "" || submits["cloudbuild.deploy.yaml"] == "" {
		t.Fatalf("the guide submits %v, want the CI and the deploy build", sortedKeys(submits))
	}
	for config, submit := range submits {
		m := regexp.MustCompile(`--service-account=projects/\$PROJECT/serviceAccounts/(\$\w+)`).FindStringSubmatch(submit)
		if m == nil {
			t.Fatalf("%s does not run as a service account of its own: %s", config, submit)
		}
		account := m[1]
		m = regexp.MustCompile(`--gcs-source-staging-dir=gs://([^/ ]+)/`).FindStringSubmatch(submit)
		if m == nil {
			t.Fatalf("%s stages its source in the default gs://<project>_cloudbuild, which %s cannot read (403 at FETCHSOURCE): %s", config, account, submit)
		}
		bucket := m[1]
		if strings.Contains(bucket, "_cloudbuild") {
			t.Errorf("the staging bucket %s is Cloud Build's default one", bucket)
		}
		created, granted := false, false
		for _, c := range cmds {
			if strings.HasPrefix(c, "gcloud storage buckets create gs://"+bucket+" ") {
				created = true
			}
			if strings.HasPrefix(c, "gcloud storage buckets add-iam-policy-binding gs://"+bucket+" ") &&
				strings.Contains(c, "--member=serviceAccount:"+account+" ") {
				if r := regexp.MustCompile(`--role=(\S+)`).FindStringSubmatch(c); r != nil && readers[r[1]] {
					granted = true
				}
			}
		}
		if !created {
			t.Errorf("the guide does not create gs://%s", bucket)
		}
		if !granted {
			t.Errorf("%s gets no object reader role on gs://%s: Cloud Build cannot fetch %s's source", account, bucket, config)
		}
		raw, err := os.ReadFile(filepath.Join(repoRoot(t), config))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(raw), "--gcs-source-staging-dir=gs://$PROJECT-relaybus-source/source") || !strings.Contains(submit, "--gcs-source-staging-dir=gs://$PROJECT-relaybus-source/source") {
			t.Errorf("%s's by-hand command and the guide must stage the source in gs://$PROJECT-relaybus-source/source", config)
		}
	}
}
