// Checker messages and row views shared by every op.
#include "src/ops/op_base.h"

namespace tboost::ops_internal {

void Checker::fail(ErrorCode code, const std::string& msg) const {
  throw Error(code, std::string(op_) + ": " + msg);
}

static std::string who(int idx, const char* role) {
  return "input " + std::to_string(idx) + " (" + role + ")";
}

void Checker::count(const std::vector<TensorDesc>& in, size_t expected,
                    const std::string& names) const {
  if (in.size() != expected)
    fail(ErrorCode::kInvalidArgument, "expected " + std::to_string(expected) + " inputs (" + names +
                                          "), got " + std::to_string(in.size()));
}

void Checker::rank(int idx, const char* role, const TensorDesc& d, int min_rank,
                   int max_rank) const {
  if (d.ndim < min_rank || d.ndim > max_rank)
    fail(ErrorCode::kShapeMismatch,
         who(idx, role) + " expected rank " +
             (min_rank == max_rank ? std::to_string(min_rank)
                                   : std::to_string(min_rank) + ".." + std::to_string(max_rank)) +
             ", got rank " + std::to_string(d.ndim) + " " + d.to_string());
}

void Checker::dtype_in(int idx, const char* role, const TensorDesc& d,
                       std::initializer_list<DType> allowed) const {
  for (DType t : allowed)
    if (d.dtype == t) return;
  std::string list;
  for (DType t : allowed) list += (list.empty() ? "" : ", ") + std::string(dtype_name(t));
  fail(ErrorCode::kDTypeMismatch,
       who(idx, role) + " expected dtype one of {" + list + "}, got " + dtype_name(d.dtype));
}

void Checker::dtype_eq(int idx, const char* role, const TensorDesc& d, DType expected,
                       const char* why) const {
  if (d.dtype != expected)
    fail(ErrorCode::kDTypeMismatch, who(idx, role) + " expected dtype " + dtype_name(expected) +
                                        (why ? std::string(" (") + why + ")" : "") + ", got " +
                                        dtype_name(d.dtype));
}

void Checker::shape_eq(int idx, const char* role, const TensorDesc& d,
                       const Shape& expected) const {
  if (d.shape() != expected)
    fail(ErrorCode::kShapeMismatch, who(idx, role) + " expected shape " +
                                        shape_to_string(expected) + ", got " + d.shape_string());
}

void Checker::dim_eq(int idx, const char* role, const TensorDesc& d, int axis, int64_t expected,
                     const char* what) const {
  if (d.dim(axis) != expected)
    fail(ErrorCode::kShapeMismatch,
         who(idx, role) + " expected dim " + std::to_string(axis) + " = " +
             std::to_string(expected) + (what ? std::string(" (") + what + ")" : "") + ", got " +
             std::to_string(d.dim(axis)) + " in shape " + d.shape_string());
}

void Checker::last_dim_contiguous(int idx, const char* role, const TensorDesc& d) const {
  if (d.ndim > 0 && d.dim(-1) > 1 && d.stride(-1) != 1)
    fail(ErrorCode::kShapeMismatch,
         who(idx, role) + " needs a contiguous last dim (stride 1), got " + d.to_string());
}

int Checker::axis(int64_t axis, int rank, const std::string& who) const {
  if (axis < -rank || axis >= rank)
    fail(ErrorCode::kInvalidArgument,
         "invalid param: axis " + std::to_string(axis) + " is outside " + std::to_string(-rank) +
             ".." + std::to_string(rank - 1) + " for " + who + " of rank " + std::to_string(rank));
  return static_cast<int>(axis < 0 ? axis + rank : axis);
}

void check_desc(const Checker& chk, const TensorDesc& d, const std::string& who) {
  if (d.ndim < 0 || d.ndim > kMaxDims)
    chk.fail(ErrorCode::kShapeMismatch, who + " has rank " + std::to_string(d.ndim) + " (0 to " +
                                            std::to_string(kMaxDims) + ")");
  int64_t n = 1, span = 0;
  for (int i = 0; i < d.ndim; ++i) {
    const auto u = static_cast<size_t>(i);
    if (d.dims[u] < 0)
      chk.fail(ErrorCode::kShapeMismatch, who + " has a negative dim " + std::to_string(d.dims[u]));
    if (d.strides[u] < 0)
      chk.fail(ErrorCode::kShapeMismatch, who + " has a negative stride " +
                                              std::to_string(d.strides[u]) + " in dim " +
                                              std::to_string(i) + " (not supported)");
    int64_t term = 0;
    if (__builtin_mul_overflow(n, d.dims[u], &n) ||
        (d.dims[u] > 0 && (__builtin_mul_overflow(d.dims[u] - 1, d.strides[u], &term) ||
                           __builtin_add_overflow(span, term, &span))))
      chk.fail(ErrorCode::kShapeMismatch, who + " " + d.shape_string() + " overflows int64 sizes");
  }
  int64_t bytes = 0;
  if (__builtin_mul_overflow(span + 1, static_cast<int64_t>(dtype_size(d.dtype)), &bytes))
    chk.fail(ErrorCode::kShapeMismatch, who + " " + d.shape_string() + " overflows int64 sizes");
}

bool overlaps(const Tensor& a, const Tensor& b) {
  if (a.numel() == 0 || b.numel() == 0) return false;
  const auto* pa = static_cast<const char*>(a.data());
  const auto* pb = static_cast<const char*>(b.data());
  const auto* ea = pa + a.desc().storage_span() * static_cast<int64_t>(dtype_size(a.dtype()));
  const auto* eb = pb + b.desc().storage_span() * static_cast<int64_t>(dtype_size(b.dtype()));
  return pa < eb && pb < ea;
}

bool same_view(const Tensor& a, const Tensor& b) {
  if (a.data() != b.data() || a.dtype() != b.dtype() || !a.desc().same_shape(b.desc()))
    return false;
  for (int i = 0; i < a.ndim(); ++i)
    if (a.dim(i) > 1 && a.stride(i) != b.stride(i)) return false;
  return true;
}

std::vector<TensorDesc> descs_of(const std::vector<Tensor>& ts) {
  std::vector<TensorDesc> d;
  d.reserve(ts.size());
  for (const Tensor& t : ts) d.push_back(t.desc());
  return d;
}

static bool same_desc(const TensorDesc& a, const TensorDesc& b) {
  if (a.dtype != b.dtype || a.ndim != b.ndim) return false;
  for (int i = 0; i < a.ndim; ++i) {
    const auto u = static_cast<size_t>(i);
    if (a.dims[u] != b.dims[u] || (a.dims[u] > 1 && a.strides[u] != b.strides[u])) return false;
  }
  return true;
}

bool same_descs(const std::vector<Tensor>& ts, const std::vector<TensorDesc>& ds) {
  if (ts.size() != ds.size()) return false;
  for (size_t i = 0; i < ts.size(); ++i)
    if (!same_desc(ts[i].desc(), ds[i])) return false;
  return true;
}

bool broadcast_shapes(const Shape& a, const Shape& b, Shape* out, int* bad) {
  const size_t n = std::max(a.size(), b.size());
  Shape s(n, 1);
  for (size_t i = 1; i <= n; ++i) {
    const int64_t da = i <= a.size() ? a[a.size() - i] : 1;
    const int64_t db = i <= b.size() ? b[b.size() - i] : 1;
    if (da != db && da != 1 && db != 1) {
      if (bad) *bad = static_cast<int>(i);
      return false;
    }
    s[n - i] = da == 1 ? db : da;
  }
  *out = s;
  return true;
}

TensorDesc broadcast_to(const TensorDesc& in, const Shape& out_shape) {
  TensorDesc d;
  d.dtype = in.dtype;
  d.ndim = static_cast<int>(out_shape.size());
  const int off = d.ndim - in.ndim;
  for (int i = 0; i < d.ndim; ++i) {
    const auto u = static_cast<size_t>(i);
    d.dims[u] = out_shape[u];
    const int j = i - off;
    d.strides[u] = (j < 0 || in.dim(j) == 1) ? 0 : in.stride(j);
  }
  return d;
}

void coalesce_views(std::initializer_list<TensorDesc*> views) {
  TBOOST_CHECK(views.size() >= 1 && views.size() <= 4, "coalesce_views takes 1 to 4 views");
  TensorDesc& first = **views.begin();
  int64_t* strides[4];
  int k = 0;
  for (TensorDesc* v : views) strides[k++] = v->strides.data();
  int n = kernels::coalesce_dims(first.ndim, first.dims.data(), strides, k);
  bool rows_ok = true;
  for (TensorDesc* v : views)
    if (n > 0 && v->strides[static_cast<size_t>(n - 1)] != 1 &&
        (v == &first || v->strides[static_cast<size_t>(n - 1)] != 0))
      rows_ok = false;
  if (!rows_ok) {
    TBOOST_CHECK_LT(n, kMaxDims, "no room for a unit last dim");
    first.dims[static_cast<size_t>(n)] = 1;
    for (TensorDesc* v : views) v->strides[static_cast<size_t>(n)] = 1;
    ++n;
  }
  for (TensorDesc* v : views) {
    v->ndim = n;
    v->dims = first.dims;
  }
}

kernels::CopyArgs copy_args(void* y, const TensorDesc& yd, const void* x, const TensorDesc& xd,
                            int threads) {
  kernels::CopyArgs c;
  c.y = y, c.y_dtype = yd.dtype;
  c.x = x, c.x_dtype = xd.dtype;
  c.ndim = yd.ndim;
  for (int i = 0; i < yd.ndim; ++i) {
    const auto u = static_cast<size_t>(i);
    c.dims[i] = yd.dims[u], c.y_strides[i] = yd.strides[u], c.x_strides[i] = xd.strides[u];
  }
  c.threads = threads;
  return c;
}

RowView row_view(const TensorDesc& d) {
  RowView v;
  v.cols = d.ndim ? d.dim(-1) : 1;
  v.outer = std::max(0, d.ndim - 1);
  v.count = 1;
  for (int i = 0; i < v.outer; ++i) {
    v.dims[i] = d.dims[static_cast<size_t>(i)];
    v.strides[i] = d.strides[static_cast<size_t>(i)];
    v.count *= v.dims[i];
  }
  // Collapse: walking outward, each dim's stride must equal the inner dim's stride times size.
  int64_t stride = -1;
  bool uniform = true;
  for (int i = v.outer - 1; i >= 0; --i) {
    if (v.dims[i] == 1) continue;
    if (stride < 0) {
      stride = v.strides[i];
    } else {
      int64_t inner = 1;
      for (int j = i + 1; j < v.outer; ++j) inner *= v.dims[j];
      if (v.strides[i] != stride * inner) uniform = false;
    }
  }
  if (uniform) v.uniform_stride = stride < 0 ? v.cols : stride;
  return v;
}

RowView element_view(const TensorDesc& d) {
  TensorDesc e = d;
  TBOOST_CHECK_LT(e.ndim, kMaxDims, "tensor of rank ", d.ndim, " has no room for a unit dim");
  e.dims[static_cast<size_t>(e.ndim)] = 1;
  e.strides[static_cast<size_t>(e.ndim)] = 1;
  ++e.ndim;
  return row_view(e);
}

}  // namespace tboost::ops_internal
