// lamport.cu: a host program (nvcc) that checks the Lamport protocol's
// element encoding with the header's own functions (cg_lamport_encode,
// cg_lamport_empty of collgen_common.cuh): for every 16-bit pattern in
// either half of a word (beside a few other halves), and for 32-bit
// patterns around every edge, the word as sent has no element of zero
// bits, so a written line is never taken for empty; it decodes (~) to the
// word itself, except that an element of all one bits (a NaN) decodes to
// the same with its sign bit clear (a NaN still); a zeroed word reads as
// empty, and so does a written word with one element not yet arrived.
// Prints "ok N" (words checked) or the first failure and exits 1. Run by
// TestLamportWordsOnHost (templates/cuda).
#include "collgen_common.cuh"
#include <cstdio>

template <int ES>
static bool check(unsigned w, unsigned long long& n) {
  n++;
  const unsigned sent = cg_lamport_encode<ES>(w);
  unsigned want = 0;
  for (int e = 0; e < 4 / ES; e++) {
    const unsigned shift = 8 * ES * e, ones = ES == 2 ? 0xffffu : 0xffffffffu, mask = ones << shift;
    const unsigned x = (w & mask) >> shift;
    want |= (x == ones ? ones >> 1 : x) << shift;
    if (((sent & mask) >> shift) == 0) {
      printf("FAIL: ES %d word %08x element %d is sent as zero bits (empty)\n", ES, w, e);
      return false;
    }
    if (!cg_lamport_empty<ES>(sent & ~mask)) {
      printf("FAIL: ES %d word %08x sent as %08x with element %d not arrived reads as arrived\n", ES, w, sent, e);
      return false;
    }
  }
  if (cg_lamport_empty<ES>(sent)) {
    printf("FAIL: ES %d word %08x sent as %08x reads as empty\n", ES, w, sent);
    return false;
  }
  if (~sent != want) {
    printf("FAIL: ES %d word %08x decodes to %08x, want %08x\n", ES, w, ~sent, want);
    return false;
  }
  return true;
}

int main() {
  unsigned long long n = 0;
  if (!cg_lamport_empty<2>(0u) || !cg_lamport_empty<4>(0u)) {
    printf("FAIL: a zeroed word is not empty\n");
    return 1;
  }
  const unsigned others[] = {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu, 0x3c00u};
  for (unsigned h = 0; h <= 0xffffu; h++)
    for (unsigned o : others)
      if (!check<2>(h | o << 16, n) || !check<2>(o | h << 16, n)) return 1;
  const unsigned edges[] = {0x00000000u, 0x80000000u, 0x7fffffffu, 0xffffffffu, 0x00000001u, 0x80000001u, 0x3f800000u,
                            0xbf800000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0x00008000u, 0x80008000u, 0x00010000u};
  for (unsigned e : edges)
    for (unsigned d = 0; d < 4096; d++)
      if (!check<4>(e + d, n) || !check<4>(e - d, n)) return 1;
  printf("ok %llu\n", n);
  return 0;
}
