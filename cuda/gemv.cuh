// The multi-token GEMV kernels' limit (gguf_mmvq.cu, int4_linear.cu, fp8_linear.cu):
// a warp keeps one float accumulator per token in registers, for at most kMaxTokens
// tokens of a decode batch. The launch code reads rawpage/ops/gemv.py GEMV_MAX_TOKENS,
// which must equal this (tests/kernels/test_gguf_mmvq.py checks it).
#pragma once

constexpr int kMaxTokens = 8;
