package ctrl

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"syscall"
)

// Store keeps the ctrl's State across restarts: FileStore in a local directory, EtcdStore in
// etcd (shared by several ctrls). Every state a Store holds has a Revision, and a Save names the
// revision its state was derived from: if the store moved on since (another writer saved), the
// Save changes nothing and fails with ErrStale, and the writer must Load the fresh state and
// decide again. That compare-and-swap is what keeps two ctrls from both placing one slab.
type Store interface {
	// Load returns the saved state and its revision; ok is false (and rev 0) if nothing was
	// ever saved.
	Load(ctx context.Context) (st State, rev Revision, ok bool, err error)
	// Save replaces the saved state if it is still at rev (0: nothing saved yet) and returns
	// the new revision; when it returns nil the state survives a crash. ErrStale: the store is
	// no longer at rev and nothing was written.
	Save(ctx context.Context, st State, rev Revision) (Revision, error)
	Close() error
}

// Revision names one saved state of a Store; a later save has a higher revision.
type Revision int64

// ErrStale is a Save whose state was derived from a revision the store has moved past.
var ErrStale = errors.New("the ctrl state changed since it was read")

// FileStore keeps the state as JSON in a directory, replaced atomically: written to a temporary
// file, fsynced, renamed over state.json, and the directory fsynced so the rename itself is
// durable. A crash at any point leaves either the old state or the new one.
//
// The lock on the directory makes this process the only writer, so the revision is a counter
// kept in memory (1 for a state found at open): it orders the writers that share this FileStore.
type FileStore struct {
	dir  string
	lock *os.File // flock held while open: two ctrls on one directory would overwrite each other

	mu  sync.Mutex // serializes Load and Save (guards the files in dir and rev)
	rev Revision   // of the state in dir; guarded by mu
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
	fs := &FileStore{dir: dir, lock: lock}
	if _, err := os.Stat(filepath.Join(dir, stateFile)); err == nil {
		fs.rev = 1
	}
	return fs, nil
}

// Dir is the state directory.
func (f *FileStore) Dir() string { return f.dir }

// Close releases the directory's lock.
func (f *FileStore) Close() error { return f.lock.Close() }

// Load reads state.json.
func (f *FileStore) Load(context.Context) (State, Revision, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	path := filepath.Join(f.dir, stateFile)
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return State{}, 0, false, nil
	}
	if err != nil {
		return State{}, 0, false, fmt.Errorf("reading the ctrl state: %w", err)
	}
	st, err := decodeState(b, path)
	if err != nil {
		return State{}, 0, false, err
	}
	return st, max(f.rev, 1), true, nil
}

func decodeState(b []byte, where string) (State, error) {
	var st State
	if err := json.NewDecoder(bytes.NewReader(b)).Decode(&st); err != nil {
		return State{}, fmt.Errorf("the ctrl state %s is corrupt: %v", where, err)
	}
	if st.Version != StateVersion {
		return State{}, fmt.Errorf("the ctrl state %s has version %d; this ctrl reads version %d", where, st.Version, StateVersion)
	}
	return st, nil
}

// Save writes state.json atomically and durably, if the state there is still at rev.
func (f *FileStore) Save(_ context.Context, st State, rev Revision) (Revision, error) {
	b, err := json.MarshalIndent(st, "", "\t")
	if err != nil {
		return 0, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if rev != f.rev {
		return 0, fmt.Errorf("%w: saving over revision %d, the state in %s is at %d", ErrStale, rev, f.dir, f.rev)
	}
	tmp := filepath.Join(f.dir, stateFile+".tmp")
	if err := writeSynced(tmp, append(b, '\n')); err != nil {
		return 0, fmt.Errorf("writing the ctrl state in %s: %w", f.dir, err)
	}
	if err := os.Rename(tmp, filepath.Join(f.dir, stateFile)); err != nil {
		return 0, fmt.Errorf("writing the ctrl state in %s: %w", f.dir, err)
	}
	d, err := os.Open(f.dir)
	if err != nil {
		return 0, fmt.Errorf("writing the ctrl state in %s: %w", f.dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return 0, fmt.Errorf("writing the ctrl state in %s: syncing the directory: %w", f.dir, err)
	}
	f.rev++
	return f.rev, nil
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
