// The device's measured copy bandwidth, for the GPU check's HBM roofline: a
// device-to-device cudaMemcpy of 1 GiB, timed with events after a warm-up;
// each copied byte is read once and written once, so the figure is
// 2 × bytes / time. Prints "copy_bandwidth_gbs <GB/s, 10^9 bytes>" and exits 0,
// or says why not and exits 1 (no GPU).
#include <cuda_runtime.h>

#include <cstdio>

int main() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::fprintf(stderr, "cuda_bandwidth: no CUDA device\n");
    return 1;
  }
  const size_t bytes = size_t{1} << 30;
  void *a = nullptr, *b = nullptr;
  if (cudaMalloc(&a, bytes) != cudaSuccess || cudaMalloc(&b, bytes) != cudaSuccess) {
    std::fprintf(stderr, "cuda_bandwidth: cannot allocate 2 GiB on the device\n");
    return 1;
  }
  cudaMemset(a, 1, bytes);
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  for (int i = 0; i < 3; ++i) cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);
  const int iters = 20;
  cudaEventRecord(start);
  for (int i = 0; i < iters; ++i) cudaMemcpyAsync(i % 2 ? a : b, i % 2 ? b : a, bytes, cudaMemcpyDeviceToDevice);
  cudaEventRecord(stop);
  cudaEventSynchronize(stop);
  float ms = 0.0f;
  cudaEventElapsedTime(&ms, start, stop);
  if (cudaGetLastError() != cudaSuccess || ms <= 0.0f) {
    std::fprintf(stderr, "cuda_bandwidth: the copies failed\n");
    return 1;
  }
  std::printf("copy_bandwidth_gbs %.1f\n", 2.0 * static_cast<double>(bytes) * iters / (ms * 1e-3) / 1e9);
  return 0;
}
