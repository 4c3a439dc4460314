// Host launcher of stage_decode_inputs (device code: kernels/staging.cuh). No host sync.
#include "cuda_launch.h"
#include "kernels/staging.cuh"
#include "ops.h"
#include "staging_checks.h"

#include <algorithm>

namespace vllm_volta {

void stage_decode_inputs(Tensor token_table, Tensor seq_lens, Tensor block_table, Tensor src_token_table,
                         Tensor src_seq_lens, Tensor src_block_table, std::optional<Tensor> input_ids) {
  const char* op = "stage_decode_inputs";
  const StageArgs a = check_stage_decode_inputs_args(token_table, seq_lens, block_table, src_token_table,
                                                     src_seq_lens, src_block_table, input_ids);
  check_cuda(op, "token_table", token_table);
  if (a.rows == 0) return;
  torch::stable::accelerator::DeviceGuard guard(token_table.get_device_index());
  const StagePointers p{static_cast<int64_t*>(token_table.data_ptr()),
                        static_cast<int*>(seq_lens.data_ptr()),
                        static_cast<int*>(block_table.data_ptr()),
                        static_cast<const int64_t*>(src_token_table.data_ptr()),
                        static_cast<const int*>(src_seq_lens.data_ptr()),
                        static_cast<const int*>(src_block_table.data_ptr()),
                        input_ids.has_value() ? static_cast<const int64_t*>(input_ids->data_ptr()) : nullptr};
  constexpr int kThreads = 256;
  const int64_t total = 4 * a.rows + a.rows * a.width;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(ceil_div(total, kThreads), 1024));
  stage_decode_inputs_kernel<<<blocks, kThreads, 0, current_stream(token_table)>>>(
      p, static_cast<int>(a.rows), static_cast<int>(a.width), a.dst_tokens, a.src_tokens, a.dst_blocks, a.src_blocks);
  check_launch(op);
}

}  // namespace vllm_volta
