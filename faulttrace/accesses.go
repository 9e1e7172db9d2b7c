package faulttrace

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
)

// An access stream is every access a program made, page by page, in order: what a replacement
// policy that sees every access (LRU) or the future (Belady's MIN) decides on. A fault trace is
// not one: it holds the accesses that missed under the policy that ran, and a resident page's
// accesses, which LRU counts as uses, are absent from it. So replaying a fault trace through LRU
// is not LRU over the program, and ReadAccesses refuses one.
//
// # Page stream format
//
// workloads/replay/pagetrace.c writes it: the 8-byte header "FMPAGES1", then one little-endian
// uint64 per access: the page number (address >> 12), with bit 63 (PagesWrote) set if the
// access wrote the page. Consecutive accesses to the same page may be written once, marked if
// any of them wrote: a repeat at once is a hit under every policy and changes no policy's
// choice (the page is already the most recently used, and is the next use of itself).
//
// The text format (page numbers one a line, optionally after a pid) is read as an access stream
// too, for streams written by hand; it says nothing of writes.

// PagesMagic starts every binary page stream; its last byte is the format version.
const PagesMagic = "FMPAGES1"

// PagesWrote marks a page stream's access that wrote its page.
const PagesWrote = 1 << 63

// Accesses is an access stream with its pages numbered densely: Seq[i] is the i-th access's
// page, an index into Pages. Dense numbers let the replays keep arrays instead of maps.
type Accesses struct {
	Seq   []uint32
	Pages []Page // by dense number: the page number and its process
	// Writes has bit i set if access i wrote its page; nil when the stream does not say
	// (a text stream).
	Writes []uint64
}

// Wrote reports whether access i wrote its page; false when the stream does not say.
func (a *Accesses) Wrote(i int) bool {
	return a.Writes != nil && a.Writes[i/64]&(1<<(i%64)) != 0
}

// Page is one distinct page of an access stream.
type Page struct {
	Pid  uint32 // 0 in a page stream (one process)
	Page uint64 // address >> 12
}

// Distinct returns how many different pages the stream touches: its cold misses, the same
// under every policy.
func (a *Accesses) Distinct() int { return len(a.Pages) }

// numberer gives each distinct page its dense number.
type numberer struct {
	a   *Accesses
	ids map[Page]uint32
}

func (n *numberer) add(p Page) error {
	id, ok := n.ids[p]
	if !ok {
		if len(n.a.Pages) == math.MaxUint32 {
			return errors.New("more than 2^32-1 distinct pages")
		}
		id = uint32(len(n.a.Pages))
		n.ids[p] = id
		n.a.Pages = append(n.a.Pages, p)
	}
	n.a.Seq = append(n.a.Seq, id)
	return nil
}

// ReadAccesses reads the access stream at path: a page stream (FMPAGES1) or a text trace. A
// binary fault trace (FMTRACE1) is refused: it holds the misses only (see Accesses).
func ReadAccesses(path string) (*Accesses, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return NewAccesses(f, path)
}

// NewAccesses reads an access stream from r; name (a file name) prefixes its errors.
func NewAccesses(r io.Reader, name string) (*Accesses, error) {
	br := bufio.NewReaderSize(r, 1<<20)
	head, err := br.Peek(len(PagesMagic))
	if err != nil && err != io.EOF {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	n := &numberer{a: &Accesses{}, ids: map[Page]uint32{}}
	switch {
	case string(head) == PagesMagic:
		br.Discard(len(PagesMagic))
		n.a.Writes = []uint64{}
		if err := readPages(br, name, n); err != nil {
			return nil, err
		}
	case len(head) == len(PagesMagic) && string(head[:len(PagesMagic)-1]) == PagesMagic[:len(PagesMagic)-1]:
		return nil, fmt.Errorf("%s: page stream format version %q is not supported (this farmem reads %s)", name, head[len(PagesMagic)-1:], PagesMagic)
	case string(head) == Magic:
		return nil, fmt.Errorf("%s is a fault trace (%s), not an access stream: it holds only the faults of the policy that ran, not the accesses to resident pages that LRU and MIN decide on; record the accesses with workloads/replay/pagetrace.c", name, Magic)
	default:
		tr, err := NewReader(br, name)
		if err != nil {
			return nil, err
		}
		for {
			rec, err := tr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				return nil, err
			}
			if err := n.add(Page{Pid: rec.Pid, Page: rec.Page()}); err != nil {
				return nil, fmt.Errorf("%s: %v", name, err)
			}
		}
	}
	if len(n.a.Seq) == 0 {
		return nil, fmt.Errorf("%s holds no accesses", name)
	}
	return n.a, nil
}

func readPages(br *bufio.Reader, name string, n *numberer) error {
	var b [8 << 10]byte
	var rec uint64
	for {
		k, err := io.ReadFull(br, b[:])
		if k%8 != 0 {
			return fmt.Errorf("%s: access %d is truncated: %d of 8 bytes", name, rec+uint64(k/8)+1, k%8)
		}
		for i := 0; i < k; i += 8 {
			rec++
			p := binary.LittleEndian.Uint64(b[i:])
			wrote := p&PagesWrote != 0
			p &^= PagesWrote
			if len(n.a.Seq)%64 == 0 {
				n.a.Writes = append(n.a.Writes, 0)
			}
			if wrote {
				n.a.Writes[len(n.a.Seq)/64] |= 1 << (len(n.a.Seq) % 64)
			}
			if p > MaxPage {
				return fmt.Errorf("%s: access %d is corrupt: page number %#x is past %#x (addresses >> 12; bit 63 marks a write)", name, rec, p, uint64(MaxPage))
			}
			if err := n.add(Page{Page: p}); err != nil {
				return fmt.Errorf("%s: %v", name, err)
			}
		}
		switch {
		case err == io.EOF || err == io.ErrUnexpectedEOF:
			return nil
		case err != nil:
			return fmt.Errorf("%s: %w", name, err)
		}
	}
}
