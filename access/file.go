package access

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"slices"

	"github.com/nats-io/nkeys"
	"go.yaml.in/yaml/v3"
)

// User is one entry of an auth file: a NATS user, its role and what the
// role is scoped to. It holds the user's public key only; the secret half
// is in the user's credentials file.
type User struct {
	Name string `yaml:"name" json:"name"`
	Role Role   `yaml:"role" json:"role"`
	NKey string `yaml:"nkey" json:"nkey"`
	// Pools are a worker's pools.
	Pools []string `yaml:"pools,omitempty" json:"pools,omitempty"`
	// Principal is the one principal an approver answers as.
	Principal string `yaml:"principal,omitempty" json:"principal,omitempty"`
	// Principals are the principals a console answers as (one per
	// signed-in person it serves).
	Principals []string `yaml:"principals,omitempty" json:"principals,omitempty"`
	// Tools are the tools a brain or delegate service answers (none: all).
	Tools []string `yaml:"tools,omitempty" json:"tools,omitempty"`
	// Resume lets a client publish unattributed resumes.
	Resume bool `yaml:"resume,omitempty" json:"resume,omitempty"`
}

// File is an auth file: the users of an engine's embedded server (engine
// --auth FILE), written by toolbatch auth.
type File struct {
	Users []User `yaml:"users"`
}

// LoadFile reads and checks an auth file.
func LoadFile(path string) (*File, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("auth file: %w", err)
	}
	var f File
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil && !errors.Is(err, io.EOF) { // an empty file has no users
		return nil, fmt.Errorf("auth file %s: %w", path, err)
	}
	if err := f.Check(); err != nil {
		return nil, fmt.Errorf("auth file %s: %w", path, err)
	}
	return &f, nil
}

// LoadOrEmpty reads an auth file, or returns an empty one when it does not
// exist yet.
func LoadOrEmpty(path string) (*File, error) {
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		return &File{}, nil
	}
	return LoadFile(path)
}

// Check reports the first bad entry, or two entries with one name or key.
func (f *File) Check() error {
	names, keys := map[string]bool{}, map[string]bool{}
	for _, u := range f.Users {
		if err := u.Check(); err != nil {
			return err
		}
		if names[u.Name] {
			return fmt.Errorf("user %s: the name is given twice", u.Name)
		}
		if keys[u.NKey] {
			return fmt.Errorf("user %s: its nkey is another user's too", u.Name)
		}
		names[u.Name], keys[u.NKey] = true, true
	}
	return nil
}

// Find returns the user named name.
func (f *File) Find(name string) (User, bool) {
	i := slices.IndexFunc(f.Users, func(u User) bool { return u.Name == name })
	if i < 0 {
		return User{}, false
	}
	return f.Users[i], true
}

// WorkerPools returns each worker user's pools, by public nkey: what an
// engine checks a claim's claimer against.
func (f *File) WorkerPools() map[string][]string {
	m := map[string][]string{}
	for _, u := range f.Users {
		if u.Role == RoleWorker {
			m[u.NKey] = u.Pools
		}
	}
	return m
}

// Remove removes the user named name and reports whether there was one.
func (f *File) Remove(name string) bool {
	n := len(f.Users)
	f.Users = slices.DeleteFunc(f.Users, func(u User) bool { return u.Name == name })
	return len(f.Users) < n
}

// Save writes the file (mode 0644: it holds public keys only), replacing
// it atomically.
func (f *File) Save(path string) error {
	if err := f.Check(); err != nil {
		return err
	}
	data, err := yaml.Marshal(f)
	if err != nil {
		return err
	}
	data = append([]byte("# toolbatch users (engine --auth): public keys only; written by toolbatch auth\n"), data...)
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func validNKey(k string) bool { return nkeys.IsValidPublicUserKey(k) }
