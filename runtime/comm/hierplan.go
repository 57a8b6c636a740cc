package comm

import (
	"github.com/collgen/collgen/coll"
)

// The hierarchical collectives of a group spanning H hosts of L ranks each
// (hostLayout) compose three kinds of step, each on a sub-group:
//
//	intra  the ranks of one host, ranked by local index: the generated
//	       kernels (a nested single-host Communicator; L = 1 makes it a
//	       copy)
//	cross  the ranks with one local index across hosts, ranked by host
//	       index: NCCL
//	copy   a device-to-device copy on this rank
//
// so that every byte crosses hosts once per host pair in each direction
// (the inter-host traffic of a rank is 1/L of the message):
//
//	all-reduce (n = L*c)  intra reduce-scatter of in into out[l*c:]
//	                      cross all-reduce of out[l*c:], in place
//	                      intra all-gather of out[l*c:] into out
//	reduce-scatter (c)    copy the W blocks of in into tmp, local index
//	                      major (block of rank hosts[h][l] to l*H+h)
//	                      intra reduce-scatter of tmp: rank l gets the H
//	                      blocks of its cross peers, summed over its host
//	                      cross reduce-scatter of those into out
//	all-gather (c)        cross all-gather of in into tmp (H blocks)
//	                      intra all-gather of tmp into tmp2 (L*H blocks)
//	                      copy the W blocks of tmp2 to their ranks in out
//
// Ranks may sit on hosts in any order (rank r on host[r] at local[r]):
// the copies put blocks in rank order. The plan is pure: tests execute it
// for whole fixed layouts on the CPU (hierplan_test.go).

// bufID names a buffer of a hierarchical step.
type bufID uint8

const (
	bufIn  bufID = iota // the call's input
	bufOut              // the call's output
	bufTmp              // the backend's scratch buffer
)

// span is an element offset into one of a call's buffers.
type span struct {
	buf bufID
	off int64
}

// scope says which sub-group runs a step.
type scope uint8

const (
	scopeCopy  scope = iota // this rank alone: copy count elements
	scopeIntra              // this rank's host, ranked by local index
	scopeCross              // this rank's local index across hosts, ranked by host
)

// hierStep is one step of a hierarchical collective. count follows the
// collective's convention on its sub-group (all-reduce: elements;
// reduce-scatter: recvCount; all-gather: sendCount); a copy moves count
// elements.
type hierStep struct {
	scope      scope
	collective coll.Collective
	src, dst   span
	count      int64
}

// hierPlan returns rank's steps for a collective with the call's count
// (all-reduce: elements, which must divide by L; reduce-scatter: recvCount;
// all-gather: sendCount) and the scratch elements they need.
func hierPlan(l hostLayout, rank int, collective coll.Collective, count int64) (steps []hierStep, tmpElems int64) {
	H, L := int64(len(l.hosts)), int64(l.perHost())
	W := H * L
	me := int64(l.local[rank])
	switch collective {
	case coll.AllReduce:
		c := count / L
		mine := span{bufOut, me * c}
		return []hierStep{
			{scopeIntra, coll.ReduceScatter, span{bufIn, 0}, mine, c},
			{scopeCross, coll.AllReduce, mine, mine, c},
			{scopeIntra, coll.AllGather, mine, span{bufOut, 0}, c},
		}, 0
	case coll.ReduceScatter:
		c := count
		for h, ranks := range l.hosts {
			for li, r := range ranks {
				steps = append(steps, hierStep{scope: scopeCopy, src: span{bufIn, int64(r) * c},
					dst: span{bufTmp, (int64(li)*H + int64(h)) * c}, count: c})
			}
		}
		steps = append(steps,
			hierStep{scopeIntra, coll.ReduceScatter, span{bufTmp, 0}, span{bufTmp, W * c}, H * c},
			hierStep{scopeCross, coll.ReduceScatter, span{bufTmp, W * c}, span{bufOut, 0}, c})
		return steps, (W + H) * c
	}
	c := count
	steps = []hierStep{
		{scopeCross, coll.AllGather, span{bufIn, 0}, span{bufTmp, 0}, c},
		{scopeIntra, coll.AllGather, span{bufTmp, 0}, span{bufTmp, H * c}, H * c},
	}
	for h, ranks := range l.hosts {
		for li, r := range ranks {
			steps = append(steps, hierStep{scope: scopeCopy, src: span{bufTmp, H*c + (int64(li)*H+int64(h))*c},
				dst: span{bufOut, int64(r) * c}, count: c})
		}
	}
	return steps, (H + W) * c
}
