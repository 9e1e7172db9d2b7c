package launcher

import (
	"bytes"
	"debug/elf"
	_ "embed"
	"fmt"

	"golang.org/x/sys/unix"
)

// The agent farmem injects into a statically linked program (shim/agent.c): a freestanding
// static-pie with no relocation to apply, so that it runs wherever it is mapped once its
// loadable segments are copied there. static.go maps it.
//
//go:embed shim/agent.elf
var agentELF []byte

// agentStackBytes is the agent thread's stack: it needs a few KiB (agent.h keeps every buffer
// there).
const agentStackBytes = 64 << 10

// agentImage is the agent as its ELF file lays it out.
type agentImage struct {
	segs       []agentSegment
	span       uint64 // bytes of address space the segments take, in whole pages
	params     uint64 // offset of fm_params (agent.c)
	paramsSize uint64
	startEntry uint64 // offset of fm_start_entry (agent.c)
	forkEntry  uint64 // offset of fm_fork_entry (agent.c)
}

// agentSegment is one loadable segment: data at offset off, memsz bytes (the rest zeros), with
// protection prot.
type agentSegment struct {
	off, memsz uint64
	data       []byte
	prot       int
}

// fm_params' layout (agent.c).
const (
	paramSockLen  = 108
	paramUffd     = 108 // int32
	paramMem      = 112
	paramMemLen   = 120
	paramStackTop = 128
	paramLifeline = 136 // int32
	paramUffdDev  = 140 // int32
	paramsBytes   = 144
)

// readAgent reads the agent's image from its ELF file and refuses one farmem could not map as
// it is: not an x86-64 position-independent executable, with a relocation or an interpreter,
// with two segments sharing a page (one protection per page), or without its two symbols.
func readAgent(b []byte) (*agentImage, error) {
	f, err := elf.NewFile(bytes.NewReader(b))
	if err != nil {
		return nil, fmt.Errorf("the agent image: %w", err)
	}
	if f.Class != elf.ELFCLASS64 || f.Machine != elf.EM_X86_64 || f.Type != elf.ET_DYN {
		return nil, fmt.Errorf("the agent image is %v %v %v, not an x86-64 position-independent executable", f.Class, f.Machine, f.Type)
	}
	for _, s := range f.Sections {
		if (s.Type == elf.SHT_RELA || s.Type == elf.SHT_REL) && s.Size > 0 {
			return nil, fmt.Errorf("the agent image has relocations (%s): it would need a loader", s.Name)
		}
	}
	img := &agentImage{}
	var lastEnd uint64
	for _, p := range f.Progs {
		switch p.Type {
		case elf.PT_INTERP, elf.PT_TLS:
			return nil, fmt.Errorf("the agent image has a %v segment", p.Type)
		case elf.PT_LOAD:
		default:
			continue
		}
		start, end := p.Vaddr&^(pageSize-1), (p.Vaddr+p.Memsz+pageSize-1)&^(pageSize-1)
		if start < lastEnd {
			return nil, fmt.Errorf("the agent image's segments at %#x and before share a page", p.Vaddr)
		}
		lastEnd = end
		data := make([]byte, p.Filesz)
		if _, err := p.ReadAt(data, 0); err != nil {
			return nil, fmt.Errorf("the agent image's segment at %#x: %w", p.Vaddr, err)
		}
		prot := 0
		if p.Flags&elf.PF_R != 0 {
			prot |= unix.PROT_READ
		}
		if p.Flags&elf.PF_W != 0 {
			prot |= unix.PROT_WRITE
		}
		if p.Flags&elf.PF_X != 0 {
			prot |= unix.PROT_EXEC
		}
		img.segs = append(img.segs, agentSegment{off: p.Vaddr, memsz: p.Memsz, data: data, prot: prot})
		img.span = end
	}
	syms, err := f.Symbols()
	if err != nil {
		return nil, fmt.Errorf("the agent image's symbols: %w", err)
	}
	for _, s := range syms {
		switch s.Name {
		case "fm_params":
			img.params, img.paramsSize = s.Value, s.Size
		case "fm_start_entry":
			img.startEntry = s.Value
		case "fm_fork_entry":
			img.forkEntry = s.Value
		}
	}
	if img.params == 0 || img.startEntry == 0 || img.forkEntry == 0 || len(img.segs) == 0 {
		return nil, fmt.Errorf("the agent image lacks fm_params, fm_start_entry or fm_fork_entry")
	}
	if img.paramsSize != paramsBytes {
		return nil, fmt.Errorf("the agent's fm_params is %d bytes, farmem writes %d (mixed builds?)", img.paramsSize, paramsBytes)
	}
	return img, nil
}
