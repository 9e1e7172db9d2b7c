package backend

import (
	"fmt"

	"github.com/pierrec/lz4/v4"
)

// lz4Codec stores pages as raw lz4 blocks: no frame header, since the store knows each blob's
// length and that it decodes to one page.
type lz4Codec struct {
	// c holds the compressor's hash table (about 136 KiB), kept across pages so that
	// compressing allocates nothing. Only Compress uses it, which Compressed serializes.
	c lz4.Compressor
}

func newLZ4() *lz4Codec { return new(lz4Codec) }

func (*lz4Codec) Name() string { return "lz4" }

func (l *lz4Codec) Compress(dst, page []byte) int {
	// dst is at least CompressBound, above lz4's bound, so CompressBlock always succeeds and
	// the error is only a guard against a caller breaking that.
	n, err := l.c.CompressBlock(page, dst)
	if err != nil || n >= compressLimit {
		return 0
	}
	return n
}

func (*lz4Codec) Decompress(dst, src []byte) error {
	// UncompressBlock keeps no state, so concurrent Loads need no lock. It fails rather than
	// write past dst, so a blob that decodes to more than a page is caught too.
	n, err := lz4.UncompressBlock(src, dst[:PageSize])
	if err != nil {
		return fmt.Errorf("%w: lz4: %v", errCorruptPage, err)
	}
	if n != PageSize {
		return fmt.Errorf("%w: lz4 gave %d bytes", errCorruptPage, n)
	}
	return nil
}

func (*lz4Codec) Close() error { return nil }
