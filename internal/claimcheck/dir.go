package claimcheck

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// Dir is a Store in a local directory (the local stack's, and tests'):
// the object <topic>/<event id> is the file <dir>/<topic>/<event id>.
type Dir struct {
	root string
}

// NewDir returns a Store in dir, which it creates if missing.
func NewDir(dir string) (*Dir, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("claimcheck: directory %q: %w", dir, err)
	}
	if err := os.MkdirAll(abs, 0o750); err != nil {
		return nil, fmt.Errorf("claimcheck: directory %q: %w", dir, err)
	}
	return &Dir{root: abs}, nil
}

// path returns key's file, refusing a key that would leave the directory.
func (d *Dir) path(key string) (string, error) {
	if !fs.ValidPath(key) || strings.Contains(key, `\`) {
		return "", fmt.Errorf("claimcheck: invalid object key %q", key)
	}
	return filepath.Join(d.root, filepath.FromSlash(key)), nil
}

// Put writes data under key, atomically (a reader sees the old object or
// the new one, never part of one).
func (d *Dir) Put(_ context.Context, key string, data []byte) error {
	p, err := d.path(key)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o750); err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(p), ".put-*")
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		_ = f.Close()
		_ = os.Remove(f.Name())
		return err
	}
	if err := f.Close(); err != nil {
		_ = os.Remove(f.Name())
		return err
	}
	return os.Rename(f.Name(), p)
}

// Get reads the object under key.
func (d *Dir) Get(_ context.Context, key string) ([]byte, error) {
	p, err := d.path(key)
	if err != nil {
		return nil, err
	}
	b, err := os.ReadFile(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w: %s", ErrNotFound, d.Ref(key))
	}
	return b, err
}

// Delete removes the object under key; a missing one is not an error.
func (d *Dir) Delete(_ context.Context, key string) error {
	p, err := d.path(key)
	if err != nil {
		return err
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// Ref is file://<dir>/<key>.
func (d *Dir) Ref(key string) string {
	return "file://" + filepath.ToSlash(d.root) + "/" + key
}
