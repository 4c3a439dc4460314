// A decode step's inputs into its CUDA graph's static buffers in one launch (device code only):
// element e of the flattened work is a token-table entry (3 x B), a sequence length (B) or a
// block-table entry (B x W), each read from its source row and written to the same row of the
// destination; input ids come from `input_ids` instead when it is given.
#pragma once

#include <cstdint>

namespace vllm_volta {

struct StagePointers {
  int64_t* token_table;
  int* seq_lens;
  int* block_table;
  const int64_t* src_token_table;
  const int* src_seq_lens;
  const int* src_block_table;
  const int64_t* input_ids;  // may be null
};

__global__ void stage_decode_inputs_kernel(StagePointers p, int rows, int width, int64_t dst_tokens,
                                           int64_t src_tokens, int64_t dst_blocks, int64_t src_blocks) {
  const int64_t total = 4LL * rows + static_cast<int64_t>(rows) * width;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (e < 3LL * rows) {
      const int64_t kind = e / rows, i = e % rows;
      p.token_table[kind * dst_tokens + i] =
          kind == 0 && p.input_ids != nullptr ? p.input_ids[i] : p.src_token_table[kind * src_tokens + i];
    } else if (e < 4LL * rows) {
      const int64_t i = e - 3LL * rows;
      p.seq_lens[i] = p.src_seq_lens[i];
    } else {
      const int64_t b = e - 4LL * rows, r = b / width, c = b % width;
      p.block_table[r * dst_blocks + c] = p.src_block_table[r * src_blocks + c];
    }
  }
}

}  // namespace vllm_volta
