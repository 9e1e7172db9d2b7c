package backend

import (
	"errors"
	"fmt"
	"strings"
)

// Codec compresses single pages for Compressed.
//
// Compressed calls Compress from one goroutine at a time, so a codec may keep scratch state
// for it without a lock; Decompress runs from many fault threads at once and must be safe for
// concurrent use. Neither may allocate per page in steady state: they run on every eviction
// and every fault.
type Codec interface {
	// Name is the name CodecByName knows the codec by.
	Name() string
	// Compress compresses page (PageSize bytes) into dst, which has at least CompressBound
	// bytes, and returns the compressed length, or 0 if that would not be below compressLimit:
	// the page is then stored raw.
	Compress(dst, page []byte) int
	// Decompress decodes src into dst (exactly PageSize bytes). It fails if src does not
	// decode to exactly PageSize bytes, so a damaged blob is never served as a page.
	Decompress(dst, src []byte) error
	// Close releases the codec's state; Compressed.Close calls it once nothing uses the codec.
	Close() error
}

// CompressBound is the room a Codec's Compress gets: above every codec's worst-case expansion
// of one page (lz4 4128 bytes, zstd about 4110), so neither ever needs to grow the buffer.
const CompressBound = 2 * PageSize

// compressLimit is the length at and above which a page is stored raw. Saving less than an
// eighth of a page is not worth a decompression on every fault of it, and a raw page's Load is
// a plain copy.
const compressLimit = PageSize - PageSize/8

// errCorruptPage is wrapped by Decompress errors: the stored blob is not one page.
var errCorruptPage = errors.New("backend: stored blob does not decode to one page")

// codecNames lists what CodecByName accepts, for its error message and flag help.
var codecNames = []string{"none", "lz4", "zstd"}

// CodecByName returns the codec called name. "none" returns a nil Codec: pages are stored
// uncompressed.
func CodecByName(name string) (Codec, error) {
	switch name {
	case "none":
		return nil, nil
	case "lz4":
		return newLZ4(), nil
	case "zstd":
		return newZstd()
	}
	return nil, fmt.Errorf("backend: unknown codec %q (valid: %s)", name, strings.Join(codecNames, ", "))
}
