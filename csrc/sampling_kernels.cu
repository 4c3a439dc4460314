// Host launchers of gumbel_sample and greedy_sample (device code: kernels/sampling.cuh). No
// host sync.
#include "cuda_launch.h"
#include "kernels/sampling.cuh"
#include "ops.h"
#include "sampling_checks.h"

namespace vllm_volta {

namespace {

// The device address of a pinned host tensor (mapped: unified addressing), or null for none.
int64_t* mapped_host_ids(const char* op, const std::optional<Tensor>& host) {
  if (!host.has_value()) return nullptr;
  void* device_ptr = nullptr;
  const cudaError_t err = cudaHostGetDevicePointer(&device_ptr, host->data_ptr(), 0);
  if (err != cudaSuccess) cudaGetLastError();  // clear it: the op fails with its own message
  VLLM_VOLTA_CHECK(err == cudaSuccess, op, ": 'sampled_host' must be pinned host memory (pin_memory=True)");
  return static_cast<int64_t*>(device_ptr);
}

// One launch: every vocabulary span folded into the row's winner in the (zeroed) workspace, whose
// last block writes the token id and zeroes its workspace entries again.
template <bool NOISE>
void launch_argmax(const char* op, Tensor sampled, Tensor logits, Tensor workspace, const SampleArgs& a,
                   const float* temperature, const int64_t* seeds, uint64_t seed_offset,
                   const std::optional<Tensor>& sampled_host) {
  check_cuda(op, "logits", logits);
  if (a.rows == 0) return;
  torch::stable::accelerator::DeviceGuard guard(logits.get_device_index());
  int64_t* host_ids = mapped_host_ids(op, sampled_host);
  const cudaStream_t stream = current_stream(logits);
  auto* best = static_cast<unsigned long long*>(workspace.data_ptr());
  auto* arrived = best + a.rows;
  auto* out = static_cast<int64_t*>(sampled.data_ptr());
  dispatch_float_type(op, logits, [&](auto type_tag) {
    using T = typename decltype(type_tag)::type;
    const auto* x = static_cast<const T*>(logits.data_ptr());
    // 16-byte loads need every row to start on a 16-byte boundary.
    const bool aligned = is_aligned16(x) && a.row_stride * sizeof(T) % 16 == 0;
    const dim3 grid(static_cast<unsigned>(a.rows), static_cast<unsigned>(ceil_div(a.vocab, kSampleBlockSpan)));
    const int vocab = static_cast<int>(a.vocab);  // < 2^30, checked
    auto* kernel = aligned ? gumbel_argmax_kernel<T, NOISE, true> : gumbel_argmax_kernel<T, NOISE, false>;
    kernel<<<grid, kSampleThreads, 0, stream>>>(out, best, arrived, x, a.row_stride, vocab, temperature, seeds,
                                                seed_offset, host_ids);
  });
  check_launch(op);
}

}  // namespace

void gumbel_sample(Tensor sampled, Tensor logits, Tensor temperature, Tensor seeds, Tensor workspace,
                   int64_t seed_offset, std::optional<Tensor> sampled_host) {
  const SampleArgs a = check_gumbel_sample_args(sampled, logits, temperature, seeds, workspace, sampled_host);
  launch_argmax<true>("gumbel_sample", sampled, logits, workspace, a,
                      static_cast<const float*>(temperature.data_ptr()), static_cast<const int64_t*>(seeds.data_ptr()),
                      static_cast<uint64_t>(seed_offset), sampled_host);
}

void greedy_sample(Tensor sampled, Tensor logits, Tensor workspace, std::optional<Tensor> sampled_host) {
  const SampleArgs a = check_greedy_sample_args(sampled, logits, workspace, sampled_host);
  launch_argmax<false>("greedy_sample", sampled, logits, workspace, a, nullptr, nullptr, 0, sampled_host);
}

}  // namespace vllm_volta
