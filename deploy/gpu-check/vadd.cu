// vadd: proves a process can use the GPU it was given: names the device
// (with its UUID, to compare with the one Voyager bound), adds two vectors
// on it and checks every element. Exit 0 only if all of that worked.
// `vadd busy N` then keeps the GPU busy for N seconds (for the agent's
// sampler to see). `vadd alloc MIB N` does only this: allocates MIB MiB on
// the device, writes it, holds it N seconds and exits 0; exit 3 if the
// allocation fails (a fraction's memory limit under CUDA MPS).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cuda_runtime.h>
__global__ void spin(long long cycles) {
  long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
}
__global__ void add(const float *a, const float *b, float *c, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) c[i] = a[i] + b[i];
}
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("vadd: %s: %s\n", #x, cudaGetErrorString(e)); return 1; } } while (0)
int main(int argc, char **argv) {
  int count = 0;
  CK(cudaGetDeviceCount(&count));
  printf("vadd: %d CUDA device(s) visible\n", count);
  if (argc == 4 && strcmp(argv[1], "alloc") == 0) {
    size_t mib = strtoull(argv[2], nullptr, 10);
    void *d = nullptr;
    cudaError_t e = cudaMalloc(&d, mib << 20);
    if (e != cudaSuccess) {
      printf("vadd: alloc %zu MiB failed: %s\n", mib, cudaGetErrorString(e));
      return 3;
    }
    CK(cudaMemset(d, 1, mib << 20));
    CK(cudaDeviceSynchronize());
    printf("vadd: alloc %zu MiB held for %s s\n", mib, argv[3]);
    fflush(stdout);
    auto end = std::chrono::steady_clock::now() + std::chrono::seconds(atoi(argv[3]));
    while (std::chrono::steady_clock::now() < end) {
      spin<<<1, 1>>>(10000000LL);
      CK(cudaDeviceSynchronize());
    }
    CK(cudaFree(d));
    return 0;
  }
  cudaDeviceProp p;
  CK(cudaGetDeviceProperties(&p, 0));
  printf("vadd: device 0 %s, %zu MiB, UUID GPU-", p.name, p.totalGlobalMem >> 20);
  for (int i = 0; i < 16; i++) { printf("%02x", (unsigned char)p.uuid.bytes[i]); if (i==3||i==5||i==7||i==9) printf("-"); }
  printf("\n");
  const int n = 1 << 24;
  static float a[n], b[n], c[n];
  float *da, *db, *dc;
  for (int i = 0; i < n; i++) { a[i] = i; b[i] = 2.0f * i; }
  CK(cudaMalloc(&da, sizeof a)); CK(cudaMalloc(&db, sizeof b)); CK(cudaMalloc(&dc, sizeof c));
  CK(cudaMemcpy(da, a, sizeof a, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(db, b, sizeof b, cudaMemcpyHostToDevice));
  add<<<(n + 255) / 256, 256>>>(da, db, dc, n);
  CK(cudaGetLastError());
  CK(cudaMemcpy(c, dc, sizeof c, cudaMemcpyDeviceToHost));
  for (int i = 0; i < n; i++) if (c[i] != 3.0f * i) { printf("vadd: wrong sum at %d: %f\n", i, c[i]); return 2; }
  printf("vadd: %d sums computed on the GPU, all right\n", n);
  if (argc == 3 && strcmp(argv[1], "busy") == 0) {
    auto end = std::chrono::steady_clock::now() + std::chrono::seconds(atoi(argv[2]));
    int launches = 0;
    while (std::chrono::steady_clock::now() < end) {
      spin<<<1, 1>>>(100000000LL);
      CK(cudaDeviceSynchronize());
      launches++;
    }
    printf("vadd: kept the GPU busy for %s s (%d kernels)\n", argv[2], launches);
  }
  return 0;
}
