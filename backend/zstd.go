package backend

import (
	"fmt"

	"github.com/klauspost/compress/zstd"
)

// zstdCodec stores pages as single-segment zstd frames at the fastest level.
type zstdCodec struct {
	// enc is used only by Compress, which Compressed serializes. Concurrency 1: one page at a
	// time is all Store ever does, and EncodeAll starts no goroutines.
	enc *zstd.Encoder
	// dec is safe for concurrent DecodeAll, but with concurrency 1 concurrent Loads of zstd
	// pages take turns on its one block decoder. DecodeAll starts no goroutines at any
	// concurrency (only streaming decodes do), so raising it is a memory-for-parallelism
	// choice, not a leak risk.
	dec *zstd.Decoder
}

func newZstd() (*zstdCodec, error) {
	enc, err := zstd.NewWriter(nil,
		zstd.WithEncoderLevel(zstd.SpeedFastest),
		zstd.WithEncoderConcurrency(1),
		// A page is the whole input: a bigger window only costs encoder memory.
		zstd.WithWindowSize(PageSize),
		zstd.WithSingleSegment(true),
		// The blob never leaves this process's memory: a checksum would cost 4 bytes a page
		// and a hash on every Store and Load for nothing.
		zstd.WithEncoderCRC(false))
	if err != nil {
		return nil, fmt.Errorf("backend: zstd encoder: %w", err)
	}
	dec, err := zstd.NewReader(nil,
		zstd.WithDecoderConcurrency(1),
		// Keep the decoder's buffers between pages rather than reallocate them per Load.
		zstd.WithDecoderLowmem(false),
		// A blob never decodes to more than a page; refuse rather than allocate for one that
		// claims to.
		zstd.WithDecoderMaxMemory(PageSize),
		zstd.WithDecodeAllCapLimit(true))
	if err != nil {
		enc.Close()
		return nil, fmt.Errorf("backend: zstd decoder: %w", err)
	}
	return &zstdCodec{enc: enc, dec: dec}, nil
}

func (*zstdCodec) Name() string { return "zstd" }

func (z *zstdCodec) Compress(dst, page []byte) int {
	// EncodeAll appends; dst's capacity (at least CompressBound) holds any page's frame, so it
	// writes into dst without allocating. Check that anyway: a grown slice is not in dst.
	out := z.enc.EncodeAll(page, dst[:0])
	if len(out) == 0 || len(out) >= compressLimit || &out[0] != &dst[0] {
		return 0
	}
	return len(out)
}

func (z *zstdCodec) Decompress(dst, src []byte) error {
	out, err := z.dec.DecodeAll(src, dst[:0:PageSize])
	if err != nil {
		return fmt.Errorf("%w: zstd: %v", errCorruptPage, err)
	}
	if len(out) != PageSize || &out[0] != &dst[0] {
		return fmt.Errorf("%w: zstd gave %d bytes", errCorruptPage, len(out))
	}
	return nil
}

func (z *zstdCodec) Close() error {
	z.dec.Close()
	return z.enc.Close()
}
