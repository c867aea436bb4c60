// torch.ops.psa_fa2.psa_attention: the Ultralytics block's channel-first attention, and
// torch.ops.psa_fa2.attention, the same on [B, H, N, D] operands; differentiable, with their
// autograd in C++.
//
// A training step at the shipped YOLO shapes runs kernels of tens of microseconds, so the
// host's per-call cost is the step's cost. Keeping the autograd node, the layout handling
// and the gradient buffers in C++ leaves one dispatcher call from Python per step and one
// C++ node in the backward graph.
//
// When q, k and v are exactly the split views of one tensor (the block's
// `qkv.view(B, H, 2*dk + dv, N).split(...)`, of a contiguous conv output or of a channels_last
// one, which Ultralytics' trainer makes on CUDA and its predictor on x86 CPUs), the node is
// attached to that tensor and the backward writes its gradient in one buffer, in the
// tensor's own memory format: no per-view gradients for autograd to cat.
//
// psa_attention's `area` (YOLO12's area attention) restricts attention to `area` equal runs
// of N. The operators see area views of the [B, H, D, N] block views, read in place:
// - [B * H, area, D, N / area], one "head" per run, where (b, h) merge into one index (the
//   views of a contiguous conv output); the forward lays out its output so that the block's
//   [B, H, dv, N] is a view of it (layout.h: empty_output_like);
// - [B * area, H, D, N / area], the runs in the batch, where (b, run) merge instead (the
//   views of a channels_last conv output, whose tokens hold the heads): Ultralytics' own
//   reshape to [B * area, N / area, 3C], without its copy.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <optional>
#include <string>
#include <tuple>

#include "../checks.h"

namespace psa_fa2 {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

std::tuple<at::Tensor, at::Tensor> call_fwd(const at::Tensor& q, const at::Tensor& k,
                                            const at::Tensor& v, double scale,
                                            const std::string& impl) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("psa_fa2::fwd", "")
          .typed<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&,
                                                    const at::Tensor&, double, c10::string_view)>();
  // Straight to the device's kernel: this node is the autograd. Through the Autograd key the
  // call would run fwd's own autograd registration, which is Python (ops.py).
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  return op.call(q, k, v, scale, impl);
}

void call_bwd(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
              const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse, double scale,
              at::Tensor& dq, at::Tensor& dk, at::Tensor& dv, const std::string& impl) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("psa_fa2::bwd", "")
          .typed<void(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                      const at::Tensor&, const at::Tensor&, double, at::Tensor&, at::Tensor&,
                      at::Tensor&, c10::string_view, bool, bool)>();
  // dq, dk and dv are fresh buffers: overwritten, never zero-filled.
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  op.call(dout, q, k, v, out, lse, scale, dq, dk, dv, impl,
          at::globalContext().deterministicAlgorithms(), /*accumulate=*/false);
}

// [B, H, D, N] (the block's view) as the operators' logical [B, H, N, D].
at::Tensor tokens_by_dims(const at::Tensor& t) { return t.transpose(2, 3); }

// Where the runs of an area go in the operators' [batch, heads] (area > 1).
enum class AreaRuns {
  kAsHeads,  // [B * H, area, D, N / area]
  kInBatch,  // [B * area, H, D, N / area]
};

// The area views that block view t ([B, H, D, N]) makes without a copy: runs as heads where
// (b, h) merge, else runs in the batch where (b, run) merge, else runs as heads on a copy.
AreaRuns area_runs_of(const at::Tensor& t) {
  const bool bh_merge = t.size(0) == 1 || t.size(1) == 1 || t.stride(0) == t.size(1) * t.stride(1);
  if (!bh_merge && t.stride(0) == t.size(3) * t.stride(3)) return AreaRuns::kInBatch;
  return AreaRuns::kAsHeads;
}

// A block view [B, H, D, N] as its area views (itself for area 1): views where the dims that
// `runs` merges do, a copy otherwise.
at::Tensor area_views(const at::Tensor& t, int64_t area, AreaRuns runs) {
  if (area == 1) return t;
  const int64_t run = t.size(3) / area;
  if (runs == AreaRuns::kInBatch) return t.unflatten(3, {area, run}).permute({0, 3, 1, 2, 4}).flatten(0, 1);
  return t.flatten(0, 1).unflatten(2, {area, run}).transpose(1, 2);
}

// The inverse for a result of area views: -> [B, H, dv, N], a view of the forward's output
// (empty_output_like), copied only where it has other strides.
at::Tensor from_area_views(const at::Tensor& t, int64_t B, int64_t H, int64_t area, AreaRuns runs) {
  if (area == 1) return t;
  if (runs == AreaRuns::kInBatch)
    return t.unflatten(0, {B, area}).permute({0, 2, 3, 1, 4}).reshape({B, H, t.size(2), t.size(3) * area});
  return t.transpose(1, 2).reshape({B, H, t.size(2), t.size(3) * area});
}

void check_area(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t area) {
  TORCH_CHECK(area >= 1, "psa_attention: area must be >= 1, got ", str(area));
  if (area == 1) return;
  TORCH_CHECK(k.sizes() == q.sizes() && v.size(0) == q.size(0) && v.size(1) == q.size(1) &&
                  v.size(3) == q.size(3),
              "psa_attention with area > 1: q, k [B, H, dk, N] and v [B, H, dv, N] must share "
              "B, H and N, got q ", describe(q), ", k ", describe(k), ", v ", describe(v));
  TORCH_CHECK(k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type(),
              "psa_attention: q, k and v must share one dtype, got ", q.scalar_type(), ", ",
              k.scalar_type(), " and ", v.scalar_type());
  TORCH_CHECK(q.size(3) % area == 0, "psa_attention: area = ", str(area),
              " must divide the sequence length N = ", str(q.size(3)),
              " (the last dim of q, k and v) into equal runs");
}

// The attention result as the block wants it: [B, H, dv, N], contiguous, so that
// `.view(B, H * dv, h, w)` is free. A channel-first `out` is that already; a token-major
// one (channels_last inputs) is copied once. Detached from out's view chain, so autograd
// treats it as the op's own output; it still shares out's version counter, so modifying
// it in place before the backward (which reads out) is reported, as for SDPA.
at::Tensor block_output(const at::Tensor& out, int64_t B, int64_t H, int64_t area,
                        AreaRuns runs = AreaRuns::kAsHeads) {
  return from_area_views(tokens_by_dims(out), B, H, area, runs).contiguous().detach();
}

// q, k, v ([B, H, N, D]) in one layout: as they are when they share one, else copied to
// `fallback` (channel-first for the block's views, which are; token-major for `attention`).
std::tuple<at::Tensor, at::Tensor, at::Tensor> operator_inputs(const at::Tensor& q,
                                                               const at::Tensor& k,
                                                               const at::Tensor& v,
                                                               Layout fallback) {
  if (shared_layout({&q, &k, &v})) return {q, k, v};
  return {in_layout(q, fallback), in_layout(k, fallback), in_layout(v, fallback)};
}

// Which operands and results: the block's [B, H, D, N] views and its [B, H, dv, N]
// contiguous result (psa_attention), or the operators' [B, H, N, D] (attention).
enum class Operands { kBlockViews, kTokensByDims };

// The backward ops have no derivative of their own: with create_graph=True the gradients
// would come back as constants, and a second-order term silently vanish. Say so instead.
void check_not_double_backward(const char* op) {
  TORCH_CHECK(!at::GradMode::is_enabled(), op,
              "'s backward is not differentiable: create_graph=True (double backward) through ",
              op, " is not supported");
}

void check_block_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  check_rank4(q, "q", "[B, H, dk, N]");
  check_rank4(k, "k", "[B, H, dk, N]");
  check_rank4(v, "v", "[B, H, dv, N]");
}

// An operand of `kOperands` as the operators' [B, H, N, D], and such a tensor (a gradient) as
// an operand: the block's views are transposed (which is its own inverse), the others kept.
template <Operands kOperands>
at::Tensor swap_block_dims(const at::Tensor& t) {
  return kOperands == Operands::kBlockViews ? tokens_by_dims(t) : t;
}

// q, k, v of any layout, each differentiable on its own.
template <Operands kOperands>
struct SeparateQKV : public torch::autograd::Function<SeparateQKV<kOperands>> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, double scale, const std::string& impl) {
    constexpr Layout kFallback =
        kOperands == Operands::kBlockViews ? Layout::kChannelFirst : Layout::kTokenMajor;
    auto [qt, kt, vt] = operator_inputs(swap_block_dims<kOperands>(q),
                                        swap_block_dims<kOperands>(k),
                                        swap_block_dims<kOperands>(v), kFallback);
    auto [out, lse] = call_fwd(qt, kt, vt, scale, impl);
    ctx->save_for_backward({qt, kt, vt, out, lse});
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["impl"] = impl;
    return kOperands == Operands::kBlockViews ? block_output(out, q.size(0), q.size(1), 1) : out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    check_not_double_backward(kOperands == Operands::kBlockViews ? "psa_attention" : "attention");
    if (!grads[0].defined()) return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &out = saved[3], &lse = saved[4];
    const Layout layout = common_layout({{"q", &q}, {"k", &k}, {"v", &v}, {"out", &out}});
    const at::Tensor dout = in_layout(swap_block_dims<kOperands>(grads[0]), layout);
    at::Tensor dq = empty_grad_like(q, layout), dk = empty_grad_like(k, layout),
               dv = empty_grad_like(v, layout);
    call_bwd(dout, q, k, v, out, lse, ctx->saved_data["scale"].toDouble(), dq, dk, dv,
             ctx->saved_data["impl"].toStringRef());
    return {swap_block_dims<kOperands>(dq), swap_block_dims<kOperands>(dk),
            swap_block_dims<kOperands>(dv), at::Tensor(), at::Tensor()};
  }
};

struct SplitDims {
  int64_t B, H, dk, dv, N;
  int64_t area = 1;
  // kChannelFirst: base is [B, H*(2dk+dv), ...] contiguous (N innermost); kTokenMajor: the
  // same channels_last, [B, N, H*(2dk+dv)] in memory (the heads inside the tokens).
  Layout layout = Layout::kChannelFirst;
  int64_t channels() const { return 2 * dk + dv; }
  // The area views' runs: as heads channel-first, in the batch token-major (where each
  // merges with b).
  AreaRuns runs() const {
    return layout == Layout::kChannelFirst ? AreaRuns::kAsHeads : AreaRuns::kInBatch;
  }
};

// [B, H, N, D] views of q, k and v inside `base`, as the operators' area views for area > 1:
// one as_strided each (view + narrow + transpose would be three ops, on the step's host path).
std::tuple<at::Tensor, at::Tensor, at::Tensor> split_views(const at::Tensor& base,
                                                           const SplitDims& d) {
  const int64_t C = d.channels(), offset = base.storage_offset(), run = d.N / d.area;
  auto part = [&](int64_t channel0, int64_t channels) {
    if (d.layout == Layout::kTokenMajor) {  // element (b, n, h, c) at ((b N + n) H + h) C + c
      const int64_t token = d.H * C;
      if (d.area == 1)
        return base.as_strided({d.B, d.H, d.N, channels}, {d.N * token, C, token, 1},
                               offset + channel0);
      return base.as_strided({d.B * d.area, d.H, run, channels}, {run * token, C, token, 1},
                             offset + channel0);
    }
    if (d.area == 1)
      return base.as_strided({d.B, d.H, d.N, channels}, {d.H * C * d.N, C * d.N, 1, d.N},
                             offset + channel0 * d.N);
    return base.as_strided({d.B * d.H, d.area, run, channels}, {C * d.N, run, 1, d.N},
                           offset + channel0 * d.N);
  };
  return {part(0, d.dk), part(d.dk, d.dk), part(2 * d.dk, d.dv)};
}

// psa_attention on the split views of `base`, differentiable in `base` itself.
//
// This is the training step's path at the shipped shapes, where the host's time is the step's
// time, so it makes no more ATen calls than it must: the views that only carry operands to the
// kernels are made below the ADInplaceOrView key (no view tracking; they never reach the
// user). The result is [B, H, dv, N] contiguous. Channel-first, that is the operator's `out`
// itself seen transposed, saved as the node's output and seen transposed again in the
// backward (saving an output keeps its in-place modification an error, as for
// `block_output`). Token-major (a channels_last base), `out` holds the heads inside the
// tokens, and the result is its one copy; the backward reads `out` itself, and takes dout in
// its layout.
struct SplitQKV : public torch::autograd::Function<SplitQKV> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& base, SplitDims d, double scale,
                            const std::string& impl) {
    at::Tensor result, lse, out_block;
    {
      at::AutoDispatchBelowADInplaceOrView below_autograd;
      auto [q, k, v] = split_views(base, d);
      at::Tensor out;
      std::tie(out, lse) = call_fwd(q, k, v, scale, impl);
      // Channel-first views give a channel-first out (or a token-major one only where that is
      // the same memory: N or both head dims 1): its transpose is contiguous, and so is the
      // block's view of area views' out.
      out_block = from_area_views(tokens_by_dims(out), d.B, d.H, d.area, d.runs());
    }
    if (d.layout == Layout::kTokenMajor) {
      result = out_block.contiguous();
      ctx->save_for_backward({base, lse, out_block});
    } else {
      result = out_block;
      ctx->save_for_backward({base, lse, result});
    }
    ctx->saved_data["dims"] =
        std::vector<int64_t>{d.B, d.H, d.dk, d.dv, d.N, d.area, static_cast<int64_t>(d.layout)};
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["impl"] = impl;
    return result;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    check_not_double_backward("psa_attention");
    if (!grads[0].defined()) return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &base = saved[0], &lse = saved[1], &out_block = saved[2];
    const auto dims = ctx->saved_data["dims"].toIntVector();
    const SplitDims d{dims[0], dims[1], dims[2], dims[3], dims[4], dims[5],
                      static_cast<Layout>(dims[6])};
    at::Tensor d_base = at::empty_like(base);  // in base's memory format
    {
      at::AutoDispatchBelowADInplaceOrView below_autograd;
      auto [q, k, v] = split_views(base, d);
      auto [dq, dk, dv] = split_views(d_base, d);
      // dout in out's memory (copied only where it is not), so that its area views are views.
      const at::Tensor dout_block = grads[0].strides() == out_block.strides()
                                        ? grads[0]
                                        : at::empty_like(out_block).copy_(grads[0]);
      call_bwd(tokens_by_dims(area_views(dout_block, d.area, d.runs())), q, k, v,
               tokens_by_dims(area_views(out_block, d.area, d.runs())), lse,
               ctx->saved_data["scale"].toDouble(), dq, dk, dv,
               ctx->saved_data["impl"].toStringRef());
    }
    return {d_base, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// The tensor q, k and v ([B, H, D, N]) were split from, when they are exactly
// `base.view(B, H, 2*dk + dv, N).split([dk, dk, dv], dim=2)` of a contiguous base, or the same
// views of a channels_last one.
std::optional<SplitDims> split_of(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  if (!q.is_view() || !k.is_view() || !v.is_view()) return std::nullopt;
  const at::Tensor base(q._base());
  if (!k._base().is_same(base) || !v._base().is_same(base) ||
      !base.is_non_overlapping_and_dense())
    return std::nullopt;
  if (base.requires_grad() != (q.requires_grad() || k.requires_grad() || v.requires_grad()))
    return std::nullopt;
  SplitDims d{q.size(0), q.size(1), q.size(2), v.size(2), q.size(3)};
  const int64_t C = d.channels();
  if (k.sizes() != q.sizes() || v.size(0) != d.B || v.size(1) != d.H || v.size(3) != d.N ||
      base.numel() != d.B * d.H * C * d.N)
    return std::nullopt;
  // The strides of a dim of size 1 are whatever the view chain left there: not compared.
  auto strides_are = [&](std::initializer_list<int64_t> strides) {
    const at::IntArrayRef want(strides);
    for (const at::Tensor* t : {&q, &k, &v})
      for (int64_t i = 0; i < 4; ++i)
        if (t->size(i) > 1 && t->stride(i) != want[i]) return false;
    return true;
  };
  // The views' channel stride: N channel-first (a contiguous base), 1 token-major (a
  // channels_last one: [B, N, H*C] in memory).
  int64_t channel_stride;
  if (base.is_contiguous() && strides_are({d.H * C * d.N, C * d.N, d.N, 1})) {
    channel_stride = d.N;
  } else if (strides_are({d.N * d.H * C, C, 1, d.H * C})) {
    d.layout = Layout::kTokenMajor;
    channel_stride = 1;
  } else {
    return std::nullopt;
  }
  const int64_t offset = base.storage_offset();
  if (q.storage_offset() != offset || k.storage_offset() != offset + d.dk * channel_stride ||
      v.storage_offset() != offset + 2 * d.dk * channel_stride)
    return std::nullopt;
  return d;
}

// psa_attention's result without gradients, on checked inputs.
at::Tensor block_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           double scale, const std::string& impl, int64_t area) {
  const AreaRuns runs = area_runs_of(q);
  auto [qt, kt, vt] = operator_inputs(tokens_by_dims(area_views(q, area, runs)),
                                      tokens_by_dims(area_views(k, area, runs)),
                                      tokens_by_dims(area_views(v, area, runs)),
                                      Layout::kChannelFirst);
  return block_output(std::get<0>(call_fwd(qt, kt, vt, scale, impl)), q.size(0), q.size(1), area,
                      runs);
}

// Below autograd (inference mode, or a caller that already handles gradients).
at::Tensor psa_attention_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 double scale, c10::string_view impl, int64_t area) {
  check_block_inputs(q, k, v);
  check_area(q, k, v, area);
  return block_attention(q, k, v, scale, std::string(impl), area);
}

at::Tensor psa_attention_autograd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  double scale, c10::string_view impl, int64_t area) {
  check_block_inputs(q, k, v);
  check_area(q, k, v, area);
  const std::string impl_name(impl);
  if (at::GradMode::is_enabled()) {
    if (auto split = split_of(q, k, v); split && q._base().requires_grad()) {
      split->area = area;
      return SplitQKV::apply(at::Tensor(q._base()), *split, scale, impl_name);
    }
    if (area > 1 && (q.requires_grad() || k.requires_grad() || v.requires_grad())) {
      // Not the split views of one tensor: one copy makes them so, and autograd takes each
      // input's gradient out of the copy's.
      const SplitDims d{q.size(0), q.size(1), q.size(2), v.size(2), q.size(3), area};
      return SplitQKV::apply(at::cat({q, k, v}, 2), d, scale, impl_name);
    }
  }
  if (area > 1) {  // no gradient to take
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    return block_attention(q, k, v, scale, impl_name, area);
  }
  return SeparateQKV<Operands::kBlockViews>::apply(q, k, v, scale, impl_name);
}

void check_attention_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  check_rank4(q, "q", "[B, H, N, dk]");
  check_rank4(k, "k", "[B, H, N, dk]");
  check_rank4(v, "v", "[B, H, N, dv]");
}

// torch.ops.psa_fa2.attention: [B, H, N, D] operands of any layout, the result in theirs.
at::Tensor attention_autograd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                              double scale, c10::string_view impl) {
  check_attention_inputs(q, k, v);
  return SeparateQKV<Operands::kTokensByDims>::apply(q, k, v, scale, std::string(impl));
}

at::Tensor attention_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             double scale, c10::string_view impl) {
  check_attention_inputs(q, k, v);
  auto [qt, kt, vt] = operator_inputs(q, k, v, Layout::kTokenMajor);
  return std::get<0>(call_fwd(qt, kt, vt, scale, std::string(impl)));
}

}  // namespace

TORCH_LIBRARY_IMPL(psa_fa2, Autograd, m) {
  m.impl("psa_attention", &psa_attention_autograd);
  m.impl("attention", &attention_autograd);
}

TORCH_LIBRARY_IMPL(psa_fa2, CompositeExplicitAutograd, m) {
  m.impl("psa_attention", &psa_attention_forward);
  m.impl("attention", &attention_forward);
}

}  // namespace psa_fa2
