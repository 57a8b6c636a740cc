// Argument structs of the test kernels, passed by value as the kernels'
// single parameter (like the generated collgen_args_* structs).
#pragma once

// 56 bytes: in[4] @0, out @32, n @40, world @48, pad @52.
struct collgen_args_w4 {
  const float* in[4];
  float* out;
  unsigned long long n;
  int world;
  int pad;
};

// 24 bytes: x @0, n @8, add @16.
struct inc_args {
  float* x;
  unsigned long long n;
  float add;
};

// 24 bytes: flag @0 (mapped host words: [0]=flag, [1]=ack), spins @8, value @16.
struct flag_args {
  volatile unsigned int* flag;
  unsigned long long spins;
  unsigned int value;
};

// 1032 bytes: out @0, v[256] @8. Larger than cg_launch's stack buffer.
struct big_args {
  float* out;
  float v[256];
};
