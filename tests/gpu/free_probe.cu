// free_probe.cu: which clean-up calls of the CUDA driver wait for a kernel
// of the same context that is still running (reliability case 39, the
// question behind Close's parked free). A kernel on stream A spins until
// the host raises a flag 300 ms after its launch; meanwhile the host
// times one clean-up call of an unrelated resource. A call taking about
// 300 ms waits for the kernel (ranks sharing a GPU, and so a context,
// deadlock there when the kernel waits for the rank that called it); a
// call taking microseconds does not.
// Then, while one thread sits in such a waiting cuMemFree, a second thread
// times a call of its own: on the same context, and on a second context of
// the same GPU (cuCtxCreate). A call held up there means the free holds a
// lock beyond its own wait: per context, or for the whole process.
// Build and run: nvcc -O2 -arch=sm_90 -o free_probe free_probe.cu -lcuda && ./free_probe
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>
#include <cuda.h>
#include <cuda_runtime.h>

#define CK(x) do { CUresult r = (x); if (r != CUDA_SUCCESS) { const char* s; cuGetErrorName(r, &s); printf("%s: %s\n", #x, s); return 1; } } while (0)

__global__ void spin(volatile unsigned* flag) {
  while (*flag == 0) {
  }
}

static const char* kPTX =
    ".version 7.0\n.target sm_50\n.address_size 64\n"
    ".visible .entry nop() { ret; }\n";

static double ms(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// timed launches the spinner on stream s, runs op, and returns how long op
// took; the flag goes up 300 ms after the launch.
template <class F>
static int timed(const char* name, CUstream s, volatile unsigned* flag, F op) {
  *flag = 0;
  spin<<<1, 1, 0, (cudaStream_t)s>>>(flag);
  if (cudaGetLastError() != cudaSuccess) {
    printf("launch failed\n");
    return 1;
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the kernel is running
  std::thread up([flag] {
    std::this_thread::sleep_for(std::chrono::milliseconds(280));
    *flag = 1;
  });
  auto t0 = std::chrono::steady_clock::now();
  CUresult r = op();
  double took = ms(t0);
  up.join();
  CK(cuStreamSynchronize(s));
  const char* rs;
  cuGetErrorName(r, &rs);
  printf("%-44s %8.3f ms  %s  %s\n", name, took, took > 200 ? "WAITS for the kernel" : "does not wait", rs);
  return 0;
}

int main() {
  CK(cuInit(0));
  cudaFree(0);  // the primary context, current
  CUcontext ctx;
  CK(cuCtxGetCurrent(&ctx));
  CUdevice dev;
  CK(cuCtxGetDevice(&dev));
  unsigned* flagHost;
  if (cudaHostAlloc(&flagHost, 64, cudaHostAllocMapped) != cudaSuccess) return 1;
  unsigned* flagDev;
  cudaHostGetDevicePointer(&flagDev, flagHost, 0);
  volatile unsigned* flag = flagHost;
  (void)flagDev;
  CUstream a, b;
  CK(cuStreamCreate(&a, CU_STREAM_NON_BLOCKING));
  CK(cuStreamCreate(&b, CU_STREAM_NON_BLOCKING));
  const size_t sz = 2 << 20;

  CUdeviceptr p;
  CK(cuMemAlloc(&p, sz));
  if (timed("cuMemFree (cuMemAlloc)", a, flag, [&] { return cuMemFree(p); })) return 1;
  if (timed("cuMemAlloc", a, flag, [&] { return cuMemAlloc(&p, sz); })) return 1;
  CK(cuMemFree(p));
  CK(cuMemAlloc(&p, sz));
  if (timed("cuMemFreeAsync (cuMemAlloc) on another stream", a, flag, [&] { return cuMemFreeAsync(p, b); })) return 1;
  CK(cuStreamSynchronize(b));
  void* h;
  CK(cuMemHostAlloc(&h, sz, 0));
  if (timed("cuMemFreeHost", a, flag, [&] { return cuMemFreeHost(h); })) return 1;
  void* reg = malloc(sz);
  CK(cuMemHostRegister(reg, sz, 0));
  if (timed("cuMemHostUnregister", a, flag, [&] { return cuMemHostUnregister(reg); })) return 1;
  free(reg);
  CUmodule mod;
  CK(cuModuleLoadData(&mod, kPTX));
  if (timed("cuModuleUnload", a, flag, [&] { return cuModuleUnload(mod); })) return 1;
  if (timed("cuModuleLoadData", a, flag, [&] { return cuModuleLoadData(&mod, kPTX); })) return 1;
  CK(cuModuleUnload(mod));
  CUstream c;
  CK(cuStreamCreate(&c, CU_STREAM_NON_BLOCKING));
  if (timed("cuStreamDestroy", a, flag, [&] { return cuStreamDestroy(c); })) return 1;
  if (timed("cuMemHostAlloc (mapped)", a, flag, [&] { return cuMemHostAlloc(&h, 64, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP); })) return 1;
  CK(cuMemFreeHost(h));
  CK(cuMemAlloc(&p, sz));
  if (timed("cuMemsetD8 (synchronous)", a, flag, [&] { return cuMemsetD8(p, 0, sz); })) return 1;
  if (timed("cuMemcpyHtoD (pageable)", a, flag, [&] { return cuMemcpyHtoD(p, reg = malloc(4096), 4096); })) return 1;
  free(reg);
  CUipcMemHandle ipch;
  if (timed("cuIpcGetMemHandle", a, flag, [&] { return cuIpcGetMemHandle(&ipch, p); })) return 1;
  CUstream sc;
  if (timed("cuStreamCreate", a, flag, [&] { return cuStreamCreate(&sc, CU_STREAM_NON_BLOCKING); })) return 1;
  CK(cuStreamDestroy(sc));
  CUfunction fn;
  CK(cuModuleLoadData(&mod, kPTX));
  if (timed("cuModuleGetFunction", a, flag, [&] { return cuModuleGetFunction(&fn, mod, "nop"); })) return 1;
  CUcontext pc;
  if (timed("cuDevicePrimaryCtxRetain (held)", a, flag, [&] { return cuDevicePrimaryCtxRetain(&pc, dev); })) return 1;
  CK(cuDevicePrimaryCtxRelease(dev));
  CK(cuModuleUnload(mod));
  CK(cuMemFree(p));
  CUevent ev;
  CK(cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
  if (timed("cuEventDestroy", a, flag, [&] { return cuEventDestroy(ev); })) return 1;
  CK(cuMemAlloc(&p, sz));
  if (timed("cuMemsetD32Async on another stream", a, flag, [&] { return cuMemsetD32Async(p, 1, sz / 4, b); })) return 1;
  CK(cuStreamSynchronize(b));
  CK(cuMemFree(p));

  // VMM: create, reserve, map; then unmap, release, free the range.
  CUmemAllocationProp prop;
  memset(&prop, 0, sizeof prop);
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = dev;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  size_t gran;
  CK(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  CUmemGenericAllocationHandle gh;
  CK(cuMemCreate(&gh, gran, &prop, 0));
  CUdeviceptr va;
  CK(cuMemAddressReserve(&va, gran, 0, 0, 0));
  CK(cuMemMap(va, gran, 0, gh, 0));
  CUmemAccessDesc acc;
  acc.location = prop.location;
  acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CK(cuMemSetAccess(va, gran, &acc, 1));
  if (timed("cuMemUnmap (VMM)", a, flag, [&] { return cuMemUnmap(va, gran); })) return 1;
  if (timed("cuMemRelease (VMM)", a, flag, [&] { return cuMemRelease(gh); })) return 1;
  if (timed("cuMemAddressFree (VMM)", a, flag, [&] { return cuMemAddressFree(va, gran); })) return 1;
  if (timed("cuMemCreate (VMM)", a, flag, [&] { return cuMemCreate(&gh, gran, &prop, 0); })) return 1;
  CK(cuMemRelease(gh));

  // A second thread's call while this thread's cuMemFree waits.
  CUcontext other;
#if CUDA_VERSION >= 13000
  CK(cuCtxCreate(&other, nullptr, 0, dev));  // CUDA 13: the params form
#else
  CK(cuCtxCreate(&other, 0, dev));
#endif
  CUstream os2;
  CUdeviceptr op2;
  CK(cuStreamCreate(&os2, CU_STREAM_NON_BLOCKING));
  CK(cuMemAlloc(&op2, sz));
  CK(cuCtxSetCurrent(ctx));
  CUdeviceptr q;
  CK(cuMemAlloc(&q, sz));
  struct Case {
    const char* name;
    CUcontext on;
    int what;  // 0 memset async, 1 launch, 2 alloc+free... alloc only
  } cases[] = {
      {"same context: cuMemsetD32Async", ctx, 0},
      {"same context: kernel launch", ctx, 1},
      {"same context: cuMemAlloc", ctx, 2},
      {"other context, same GPU: cuMemsetD32Async", other, 0},
      {"other context, same GPU: cuMemAlloc", other, 2},
  };
  for (auto& cs : cases) {
    CK(cuMemAlloc(&p, sz));
    double took = 0;
    CUresult r2 = CUDA_SUCCESS;
    CUdeviceptr extra = 0;
    std::thread second([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(40));  // the free is waiting
      cuCtxSetCurrent(cs.on);
      auto t0 = std::chrono::steady_clock::now();
      if (cs.what == 0) r2 = cuMemsetD32Async(cs.on == ctx ? q : op2, 7, sz / 4, cs.on == ctx ? b : os2);
      if (cs.what == 1) {
        spin<<<1, 1, 0, (cudaStream_t)b>>>(flag);  // flag already up: returns at once
        r2 = (CUresult)cudaGetLastError();
      }
      if (cs.what == 2) r2 = cuMemAlloc(&extra, sz);
      took = ms(t0);
    });
    char label[96];
    snprintf(label, sizeof label, "cuMemFree waiting; second thread");
    *flag = 0;
    spin<<<1, 1, 0, (cudaStream_t)a>>>(flag);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    std::thread up([flag] {
      std::this_thread::sleep_for(std::chrono::milliseconds(280));
      *flag = 1;
    });
    CUresult r1 = cuMemFree(p);
    up.join();
    second.join();
    CK(cuCtxSetCurrent(ctx));
    CK(cuStreamSynchronize(a));
    CK(cuCtxSynchronize());
    if (extra) {
      CK(cuCtxSetCurrent(cs.on));
      CK(cuMemFree(extra));
      CK(cuCtxSetCurrent(ctx));
    }
    const char* rs;
    cuGetErrorName(r2, &rs);
    printf("%s, %-40s %8.3f ms  %s  (free %d) %s\n", label, cs.name, took, took > 150 ? "HELD UP by the free" : "not held up", (int)r1, rs);
  }
  return 0;
}
