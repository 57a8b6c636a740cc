#include "textflag.h"

// func copyNTBlocks(dst, src *byte, n uintptr)
//
// Copies n bytes (n > 0, a multiple of 64) from src to dst, which is
// 16-byte aligned, with non-temporal stores, then fences them (SFENCE) so
// that they are ordered before any later store of this thread.
TEXT ·copyNTBlocks(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
loop:
	MOVOU 0(SI), X0
	MOVOU 16(SI), X1
	MOVOU 32(SI), X2
	MOVOU 48(SI), X3
	MOVNTO X0, 0(DI)
	MOVNTO X1, 16(DI)
	MOVNTO X2, 32(DI)
	MOVNTO X3, 48(DI)
	ADDQ $64, SI
	ADDQ $64, DI
	SUBQ $64, CX
	JNZ loop
	SFENCE
	RET

// func spinPause()
//
// One PAUSE: the spin-wait hint (it frees the core's pipeline for a
// sibling thread and lets a hypervisor see a spinning vCPU).
TEXT ·spinPause(SB), NOSPLIT, $0-0
	PAUSE
	RET
