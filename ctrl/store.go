package ctrl

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"syscall"
)

// Store keeps the ctrl's State across restarts. It is an interface so that a replicated store
// (etcd) can back a highly available ctrl later; FileStore is the one there is.
type Store interface {
	// Load returns the saved state; ok is false if nothing was ever saved.
	Load() (st State, ok bool, err error)
	// Save replaces the saved state; when it returns nil the state survives a crash.
	Save(State) error
}

// FileStore keeps the state as JSON in a directory, replaced atomically: written to a temporary
// file, fsynced, renamed over state.json, and the directory fsynced so the rename itself is
// durable. A crash at any point leaves either the old state or the new one.
type FileStore struct {
	dir  string
	lock *os.File // flock held while open: two ctrls on one directory would overwrite each other

	mu sync.Mutex // serializes Load and Save (guards the files in dir)
}

const stateFile = "state.json"

// OpenFileStore opens (creating it if needed) a state directory and takes its lock.
func OpenFileStore(dir string) (*FileStore, error) {
	if dir == "" {
		return nil, fmt.Errorf("no ctrl state directory given: pass --state DIR")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("cannot create the ctrl state directory %s: %v (choose another with --state DIR)", dir, cause(err))
	}
	lock, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("cannot write in the ctrl state directory %s: %v (choose another with --state DIR)", dir, cause(err))
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		lock.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("another farmem ctrl is using the state directory %s", dir)
		}
		return nil, fmt.Errorf("cannot lock the ctrl state directory %s: %v", dir, err)
	}
	// The lock file being writable does not prove a new file can be created (a full disk can
	// let one through and not the next): probe the way Save writes.
	probe, err := os.CreateTemp(dir, ".probe-*")
	if err != nil {
		lock.Close()
		return nil, fmt.Errorf("cannot write in the ctrl state directory %s: %v (choose another with --state DIR)", dir, cause(err))
	}
	probe.Close()
	os.Remove(probe.Name())
	return &FileStore{dir: dir, lock: lock}, nil
}

// Dir is the state directory.
func (f *FileStore) Dir() string { return f.dir }

// Close releases the directory's lock.
func (f *FileStore) Close() error { return f.lock.Close() }

// Load reads state.json.
func (f *FileStore) Load() (State, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	path := filepath.Join(f.dir, stateFile)
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return State{}, false, nil
	}
	if err != nil {
		return State{}, false, fmt.Errorf("reading the ctrl state: %w", err)
	}
	var st State
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&st); err != nil {
		return State{}, false, fmt.Errorf("the ctrl state %s is corrupt: %v", path, err)
	}
	if st.Version != StateVersion {
		return State{}, false, fmt.Errorf("the ctrl state %s has version %d; this ctrl reads version %d", path, st.Version, StateVersion)
	}
	return st, true, nil
}

// Save writes state.json atomically and durably.
func (f *FileStore) Save(st State) error {
	b, err := json.MarshalIndent(st, "", "\t")
	if err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	tmp := filepath.Join(f.dir, stateFile+".tmp")
	if err := writeSynced(tmp, append(b, '\n')); err != nil {
		return fmt.Errorf("writing the ctrl state in %s: %w", f.dir, err)
	}
	if err := os.Rename(tmp, filepath.Join(f.dir, stateFile)); err != nil {
		return fmt.Errorf("writing the ctrl state in %s: %w", f.dir, err)
	}
	d, err := os.Open(f.dir)
	if err != nil {
		return fmt.Errorf("writing the ctrl state in %s: %w", f.dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("writing the ctrl state in %s: syncing the directory: %w", f.dir, err)
	}
	return nil
}

func writeSynced(path string, b []byte) error {
	fh, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err := fh.Write(b); err != nil {
		fh.Close()
		return err
	}
	if err := fh.Sync(); err != nil {
		fh.Close()
		return err
	}
	return fh.Close()
}

// cause is the errno under a path error: the path is already in our message.
func cause(err error) error {
	if u := errors.Unwrap(err); u != nil {
		return u
	}
	return err
}
