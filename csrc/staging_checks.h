// Argument validation of stage_decode_inputs, shared by the CUDA launcher and the Meta kernel.
#pragma once

#include "op_checks.h"

#include <cstdint>
#include <optional>

namespace vllm_volta {

struct StageArgs {
  int64_t rows;        // B: the step's sequences
  int64_t width;       // W: block-table entries per source row
  int64_t dst_tokens;  // token_table's row stride (elements)
  int64_t src_tokens;  // src_token_table's row stride
  int64_t dst_blocks;  // block_table's row stride
  int64_t src_blocks;  // src_block_table's row stride
};

namespace detail {
// A 2-D tensor of `dtype` whose last dimension is contiguous; returns its row stride.
inline int64_t check_rows_2d(const char* op, const char* arg, const Tensor& t, ScalarType dtype,
                             const char* dtype_str) {
  VLLM_VOLTA_CHECK(t.scalar_type() == dtype && t.dim() == 2, op, ": '", arg, "' must be a 2-D ", dtype_str,
                  " tensor");
  return row_layout(op, arg, t).row_stride;
}
}  // namespace detail

// stage_decode_inputs: a decode step's B rows into the (larger) static buffers of its CUDA graph.
//   token_table [3, N] int64 <- src_token_table [3, B] (input ids, positions, slot mapping), B <= N;
//   seq_lens [N] int32 <- src_seq_lens [B];
//   block_table [N, M] int32 <- src_block_table [B, W], W <= M (columns past W untouched);
//   input_ids [B] int64 (optional) replaces the copied input ids.
inline StageArgs check_stage_decode_inputs_args(const Tensor& token_table, const Tensor& seq_lens,
                                                const Tensor& block_table, const Tensor& src_token_table,
                                                const Tensor& src_seq_lens, const Tensor& src_block_table,
                                                const std::optional<Tensor>& input_ids) {
  const char* op = "stage_decode_inputs";
  using detail::check_rows_2d;
  StageArgs a{};
  a.dst_tokens = check_rows_2d(op, "token_table", token_table, ScalarType::Long, "int64");
  a.src_tokens = check_rows_2d(op, "src_token_table", src_token_table, ScalarType::Long, "int64");
  a.dst_blocks = check_rows_2d(op, "block_table", block_table, ScalarType::Int, "int32");
  a.src_blocks = check_rows_2d(op, "src_block_table", src_block_table, ScalarType::Int, "int32");
  check_vector_1d(op, "seq_lens", seq_lens, ScalarType::Int, "int32");
  check_vector_1d(op, "src_seq_lens", src_seq_lens, ScalarType::Int, "int32");
  a.rows = src_seq_lens.size(0);
  a.width = src_block_table.size(1);
  const int64_t n = seq_lens.size(0);
  VLLM_VOLTA_CHECK(token_table.size(0) == 3 && token_table.size(1) == n && block_table.size(0) == n, op,
                  ": 'token_table' must be [3, N] and 'block_table' [N, max_blocks] for 'seq_lens' [N] (N = ", n, ")");
  VLLM_VOLTA_CHECK(a.rows <= n, op, ": the step has ", a.rows, " rows but the buffers hold ", n);
  VLLM_VOLTA_CHECK(src_token_table.size(0) == 3 && src_token_table.size(1) == a.rows &&
                      src_block_table.size(0) == a.rows,
                  op, ": 'src_token_table' must be [3, B] and 'src_block_table' [B, W] for 'src_seq_lens' [B] (B = ",
                  a.rows, ")");
  VLLM_VOLTA_CHECK(a.width <= block_table.size(1), op, ": 'src_block_table' has ", a.width,
                  " columns, more than 'block_table' (", block_table.size(1), ")");
  const Tensor* others[] = {&seq_lens, &block_table, &src_token_table, &src_seq_lens, &src_block_table};
  const char* names[] = {"seq_lens", "block_table", "src_token_table", "src_seq_lens", "src_block_table"};
  for (int i = 0; i < 5; ++i) check_same_device(op, names[i], *others[i], token_table, "token_table");
  if (input_ids.has_value()) {
    check_vector_1d(op, "input_ids", *input_ids, ScalarType::Long, "int64");
    VLLM_VOLTA_CHECK(input_ids->size(0) == a.rows, op, ": 'input_ids' must have one entry per row (", a.rows, ")");
    check_same_device(op, "input_ids", *input_ids, token_table, "token_table");
  }
  return a;
}

}  // namespace vllm_volta
