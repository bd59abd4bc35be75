// tests/gpu/test_kernels.cu: every kernel of cuda::backend against its CPU twin (the same entry point
// of cpu::backend), on fresh random inputs per check, for float, double and bf16, on sizes that are
// not multiples of the block or tile sizes.
//
// Each check runs the GPU entry point twice, each time on freshly uploaded inputs and outputs
// filled with NaN (an element the kernel forgets to write shows as NaN), and asserts
//   - both runs give the same bits (every kernel of the contract is deterministic), and
//   - ||gpu - cpu|| / ||cpu|| <= 1e-12 (double), 1e-5 (float), 1e-2 (bf16).
// The memory-bound kernels with 16-byte vector paths (norms, bias, add, GELU) are checked again on
// aligned and misaligned tensors and on row widths that pick each path (test_vector_paths), the
// cross-entropy row kernels likewise, with padded columns and labels on and off this rank
// (test_cross_entropy_paths), and their fused forward-backward (test_cross_entropy_fused); the
// one-kernel column sums at a training step's sizes (test_bias_grad_large).
//
// Usage: test_kernels [--small] [--quiet]   (--small: sizes for compute-sanitizer)
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <span>
#include <tuple>
#include <limits>
#include <string>
#include <vector>

#include <strata/backend/cpu/backend.hpp>

#include "check.hpp"

using namespace gpu_test;
using strata::cuda::backend;
using twin = strata::cpu::backend;  // the CPU twin of every entry point

namespace {

struct harness {
  backend& device;
  suite& results;
  std::uint64_t seed = 1;
  host_rng fresh() { return host_rng(0x5eed0000 + seed++); }
};

template <class T>
std::vector<T> download(const backend& device, const device_vector<T>& d) {
  std::vector<T> host(d.size());
  device.copy_to_host(d.data(), static_cast<index_t>(d.size()), host.data());
  return host;
}
template <class T>
void upload(const backend& device, const std::vector<T>& host, const device_vector<T>& d) {
  device.copy_from_host(host.data(), static_cast<index_t>(host.size()), d.data());
}
template <class T>
void nan_fill(const backend& device, const device_vector<T>& d) {
  if constexpr (std::is_same_v<T, std::int32_t>) {
    STRATA_CUDA_CHECK(cudaMemsetAsync(d.data(), 0xff, d.bytes(), device.stream()));
  } else {
    device.fill(d.data(), static_cast<index_t>(d.size()), std::numeric_limits<double>::quiet_NaN());
  }
}

// One output of a check: the two GPU runs and the reference.
template <class V>
void compare(harness& h, const std::string& label, const std::string& output, const std::vector<V>& first,
             const std::vector<V>& second, const std::vector<V>& reference, double tol) {
  const bool repeat = same_bits(first, second);
  const double error = relative_error(first, reference);
  h.results.record(repeat && error <= tol, label + " " + output + ": rel " + format("%.2e", error) + " (tol " +
                                               format("%.0e", tol) + "), " +
                                               (repeat ? "same bits twice" : "DIFFERENT bits on the second run"));
}

template <class T>
std::string shape_label(const std::string& kernel, const std::string& dims) {
  return kernel + "<" + type_name<T>() + "> " + dims;
}
std::string dims(index_t rows, index_t cols) { return "rows=" + std::to_string(rows) + " cols=" + std::to_string(cols); }

// ---------------------------------------------------------------------------------------------------
template <class T>
void test_elementwise(harness& h, index_t rows, index_t cols) {
  using A = accumulate_t<T>;
  const index_t n = rows * cols;
  const auto N = static_cast<std::size_t>(n);
  const double tol = tolerance<T>();
  auto& dev = h.device;
  {  // fill
    device_vector<T> x(N);
    std::vector<T> ref(N, T(0.37));
    auto run = [&] { nan_fill(dev, x); dev.fill(x.data(), n, 0.37); return download(dev, x); };
    auto a = run(), b = run();
    compare(h, shape_label<T>("fill", dims(rows, cols)), "x", a, b, ref, tol);
  }
  {  // copy, copy_to_host / copy_from_host round trip
    auto rng = h.fresh();
    auto src = rng.template uniform<T>(N);
    device_vector<T> s(N), d(N);
    auto run = [&] { upload(dev, src, s); nan_fill(dev, d); dev.copy(s.data(), n, d.data()); return download(dev, d); };
    auto a = run(), b = run();
    compare(h, shape_label<T>("copy", dims(rows, cols)), "dst", a, b, src, 0.0);
  }
  {  // add, out separate and aliasing a
    auto rng = h.fresh();
    auto va = rng.template uniform<T>(N), vb = rng.template uniform<T>(N);
    std::vector<T> ref(N);
    twin::add(va.data(), vb.data(), n, ref.data());
    device_vector<T> a(N), b(N), out(N);
    auto run = [&] {
      upload(dev, va, a); upload(dev, vb, b); nan_fill(dev, out);
      dev.add(a.data(), b.data(), n, out.data());
      return download(dev, out);
    };
    auto r1 = run(), r2 = run();
    compare(h, shape_label<T>("add", dims(rows, cols)), "out", r1, r2, ref, tol);
    auto run_alias = [&] { upload(dev, va, a); upload(dev, vb, b); dev.add(a.data(), b.data(), n, a.data()); return download(dev, a); };
    auto s1 = run_alias(), s2 = run_alias();
    compare(h, shape_label<T>("add", dims(rows, cols) + " out=a"), "a", s1, s2, ref, tol);
  }
  {  // scale and scale_by
    auto rng = h.fresh();
    auto vx = rng.template uniform<T>(N);
    std::vector<T> ref = vx;
    twin::scale(ref.data(), n, -1.75);
    device_vector<T> x(N);
    auto run = [&] { upload(dev, vx, x); dev.scale(x.data(), n, -1.75); return download(dev, x); };
    auto r1 = run(), r2 = run();
    compare(h, shape_label<T>("scale", dims(rows, cols)), "x", r1, r2, ref, tol);
    device_vector<double> factor(1);
    const std::vector<double> f{0.3125};
    std::vector<T> ref_by = vx;
    twin::scale(ref_by.data(), n, 0.3125);
    auto run_by = [&] { upload(dev, vx, x); upload(dev, f, factor); dev.scale_by(x.data(), n, factor.data()); return download(dev, x); };
    auto q1 = run_by(), q2 = run_by();
    compare(h, shape_label<T>("scale_by", dims(rows, cols)), "x", q1, q2, ref_by, tol);
  }
  {  // transpose
    auto rng = h.fresh();
    auto vin = rng.template uniform<T>(N);
    std::vector<T> ref(N);
    twin::transpose(vin.data(), rows, cols, ref.data());
    device_vector<T> in(N), out(N);
    auto run = [&] { upload(dev, vin, in); nan_fill(dev, out); dev.transpose(in.data(), rows, cols, out.data()); return download(dev, out); };
    auto r1 = run(), r2 = run();
    compare(h, shape_label<T>("transpose", dims(rows, cols)), "out", r1, r2, ref, 0.0);
  }
  {  // gelu forward / backward
    auto rng = h.fresh();
    auto vx = rng.template uniform<T>(N, -3, 3), vdy = rng.template uniform<T>(N);
    std::vector<T> ref_y(N), ref_dx(N);
    twin::gelu_forward<T>(vx.data(), n, ref_y.data());
    twin::gelu_backward<T>(vdy.data(), vx.data(), n, ref_dx.data());
    device_vector<T> x(N), dy(N), y(N), dx(N);
    auto run = [&] {
      upload(dev, vx, x); upload(dev, vdy, dy); nan_fill(dev, y); nan_fill(dev, dx);
      dev.gelu_forward(x.data(), n, y.data());
      dev.gelu_backward(dy.data(), x.data(), n, dx.data());
      return std::pair{download(dev, y), download(dev, dx)};
    };
    auto r1 = run(), r2 = run();
    compare(h, shape_label<T>("gelu_forward", dims(rows, cols)), "y", r1.first, r2.first, ref_y, tol);
    compare(h, shape_label<T>("gelu_backward", dims(rows, cols)), "dx", r1.second, r2.second, ref_dx, tol);
  }
  {  // swiglu forward / backward: gate_up [rows, 2 cols]
    auto rng = h.fresh();
    auto vgu = rng.template uniform<T>(2 * N, -3, 3), vdy = rng.template uniform<T>(N);
    std::vector<T> ref_y(N), ref_dgu(2 * N);
    twin::swiglu_forward<T>(vgu.data(), rows, cols, ref_y.data());
    twin::swiglu_backward<T>(vdy.data(), vgu.data(), rows, cols, ref_dgu.data());
    device_vector<T> gu(2 * N), dy(N), y(N), dgu(2 * N);
    auto run = [&] {
      upload(dev, vgu, gu); upload(dev, vdy, dy); nan_fill(dev, y); nan_fill(dev, dgu);
      dev.swiglu_forward(gu.data(), rows, cols, y.data());
      dev.swiglu_backward(dy.data(), gu.data(), rows, cols, dgu.data());
      return std::pair{download(dev, y), download(dev, dgu)};
    };
    auto r1 = run(), r2 = run();
    compare(h, shape_label<T>("swiglu_forward", dims(rows, cols)), "y", r1.first, r2.first, ref_y, tol);
    compare(h, shape_label<T>("swiglu_backward", dims(rows, cols)), "dgate_up", r1.second, r2.second, ref_dgu, tol);
  }
  {  // dropout forward / backward at a sharded<-1> global index (tp = 3, rank 1)
    auto rng = h.fresh();
    auto vx = rng.template uniform<T>(N);
    const strata::GlobalIndexMap map{cols, cols * 3, cols};
    const double p = 0.1;
    const std::uint64_t key = 0xd209ull + static_cast<std::uint64_t>(n);
    std::vector<T> ref = vx;
    twin::dropout_forward(ref.data(), n, map, p, key);
    device_vector<T> x(N);
    auto run = [&](bool backward) {
      upload(dev, vx, x);
      if (backward) dev.dropout_backward(x.data(), n, map, p, key);
      else dev.dropout_forward(x.data(), n, map, p, key);
      return download(dev, x);
    };
    auto f1 = run(false), f2 = run(false), b1 = run(true);
    compare(h, shape_label<T>("dropout_forward", dims(rows, cols)), "x", f1, f2, ref, tol);
    compare(h, shape_label<T>("dropout_backward", dims(rows, cols)), "dy (same mask as forward)", b1, f1, ref, tol);
  }
  {  // init_normal at a global index: rank 2 of 4 of a [rows, 8 cols] weight split on its columns in two
     // stacked blocks (SwiGLU's [gate; up]), so the local [rows, 2 cols] interleaves two global ranges
    const strata::ShardIndexMap map(strata::Shape{rows, 8 * cols}, strata::ShardSpec::split(1, 2, 4, 2));
    const std::uint64_t key = strata::rng::parameter_key(1234, "layer.weight");
    std::vector<T> ref(2 * N);
    twin::init_normal(ref.data(), 2 * n, map, key, 0.02);
    device_vector<T> x(2 * N);
    auto run = [&] { nan_fill(dev, x); dev.init_normal(x.data(), 2 * n, map, key, 0.02); return download(dev, x); };
    auto r1 = run(), r2 = run();
    compare(h, shape_label<T>("init_normal", dims(rows, cols)), "x", r1, r2, ref, tol);
  }
  {  // adamw_step
    auto rng = h.fresh();
    auto vmain = rng.template uniform<A>(N), vm = rng.template uniform<A>(N, -0.1, 0.1),
         vv = rng.template uniform<A>(N, 0.0, 0.01), vg = rng.template uniform<A>(N);
    strata::AdamWStep<A> step{A(1e-3), A(0.9), A(0.95), A(0.1), A(0.05), A(1e-8), A(1e-3 * 0.1), A(1 - std::pow(0.9, 3)),
                            A(1 - std::pow(0.95, 3))};
    std::vector<A> rmain = vmain, rm = vm, rv = vv;
    std::vector<T> rvalue(N);
    twin::adamw_step<T>(rmain.data(), rm.data(), rv.data(), vg.data(), rvalue.data(), n, step);
    device_vector<A> main(N), m(N), v(N), g(N);
    device_vector<T> value(N);
    auto run = [&] {
      upload(dev, vmain, main); upload(dev, vm, m); upload(dev, vv, v); upload(dev, vg, g); nan_fill(dev, value);
      dev.adamw_step<T>(main.data(), m.data(), v.data(), g.data(), value.data(), n, step);
      return std::tuple{download(dev, main), download(dev, m), download(dev, v), download(dev, value)};
    };
    auto r1 = run(), r2 = run();
    const std::string label = shape_label<T>("adamw_step", dims(rows, cols));
    compare(h, label, "main", std::get<0>(r1), std::get<0>(r2), rmain, tol);
    compare(h, label, "exp_avg", std::get<1>(r1), std::get<1>(r2), rm, tol);
    compare(h, label, "exp_avg_sq", std::get<2>(r1), std::get<2>(r2), rv, tol);
    compare(h, label, "value", std::get<3>(r1), std::get<3>(r2), rvalue, tol);
  }
  {  // sum_of_squares (accumulates into 0.5)
    auto rng = h.fresh();
    auto vx = rng.template uniform<T>(N);
    std::vector<double> ref{0.5};
    twin::sum_of_squares(vx.data(), n, ref.data());
    device_vector<T> x(N);
    device_vector<double> acc(1);
    auto run = [&] { upload(dev, vx, x); upload(dev, std::vector<double>{0.5}, acc); dev.sum_of_squares(x.data(), n, acc.data()); return download(dev, acc); };
    auto r1 = run(), r2 = run();
    compare(h, shape_label<T>("sum_of_squares", dims(rows, cols)), "accumulator", r1, r2, ref, tolerance<double>() * 10);
  }
}

template <class From, class To>
void test_convert(harness& h, index_t n) {
  auto rng = h.fresh();
  auto vsrc = rng.template uniform<From>(static_cast<std::size_t>(n), -100, 100);
  std::vector<To> ref(static_cast<std::size_t>(n));
  twin::convert(vsrc.data(), n, ref.data());
  device_vector<From> src(static_cast<std::size_t>(n));
  device_vector<To> dst(static_cast<std::size_t>(n));
  auto run = [&] { upload(h.device, vsrc, src); nan_fill(h.device, dst); h.device.convert(src.data(), n, dst.data()); return download(h.device, dst); };
  auto r1 = run(), r2 = run();
  compare(h, "convert<" + type_name<From>() + "," + type_name<To>() + "> n=" + std::to_string(n), "dst", r1, r2, ref, 0.0);
}

void test_transpose_int(harness& h, index_t rows, index_t cols) {
  const auto N = static_cast<std::size_t>(rows * cols);
  auto rng = h.fresh();
  auto vin = rng.integers(N, -1000000, 1000000);
  std::vector<std::int32_t> ref(N);
  twin::transpose(vin.data(), rows, cols, ref.data());
  device_vector<std::int32_t> in(N), out(N);
  auto run = [&] { upload(h.device, vin, in); nan_fill(h.device, out); h.device.transpose(in.data(), rows, cols, out.data()); return download(h.device, out); };
  auto r1 = run(), r2 = run();
  h.results.record(same_bits(r1, ref) && same_bits(r2, ref), "transpose<int32> " + dims(rows, cols) + " out: exact");
}

// ---------------------------------------------------------------------------------------------------
// The vector paths of the norms, bias_add, bias_grad, add and GELU (16-byte loads, a warp per norm
// row held in registers) and their fallbacks: every tensor starts `offset` elements into its
// allocation, so offset 0 takes the vector paths where cols allows and offset 1 the fallbacks.
template <class V>
std::vector<V> download_at(const backend& device, const V* p, std::size_t n) {
  std::vector<V> host(n);
  device.copy_to_host(p, static_cast<index_t>(n), host.data());
  return host;
}
template <class V>
void upload_at(const backend& device, const std::vector<V>& host, V* p) {
  device.copy_from_host(host.data(), static_cast<index_t>(host.size()), p);
}
template <class V>
void nan_fill_at(const backend& device, V* p, std::size_t n) {
  device.fill(p, static_cast<index_t>(n), std::numeric_limits<double>::quiet_NaN());
}

template <class T>
void test_vector_paths(harness& h, index_t rows, index_t cols, index_t offset) {
  using A = accumulate_t<T>;
  const auto R = static_cast<std::size_t>(rows), C = static_cast<std::size_t>(cols), N = R * C;
  const auto at = static_cast<std::size_t>(offset);
  const double tol = tolerance<T>();
  auto& dev = h.device;
  const std::string shape = dims(rows, cols) + " offset=" + std::to_string(offset);
  // Tensors of n elements starting `offset` elements into their allocation.
  std::vector<std::unique_ptr<device_vector<T>>> keep_t;
  std::vector<std::unique_ptr<device_vector<A>>> keep_a;
  auto tensor = [&](std::size_t n) { keep_t.push_back(std::make_unique<device_vector<T>>(n + at)); return keep_t.back()->data() + at; };
  auto stats = [&](std::size_t n) { keep_a.push_back(std::make_unique<device_vector<A>>(n + at)); return keep_a.back()->data() + at; };

  auto rng = h.fresh();
  auto vx = rng.template uniform<T>(N, -2, 3), vr = rng.template uniform<T>(N), vdy = rng.template uniform<T>(N),
       vg = rng.template uniform<T>(C, 0.5, 1.5), vb = rng.template uniform<T>(C);
  auto vdb = rng.template uniform<A>(C);
  T *x = tensor(N), *r = tensor(N), *dy = tensor(N), *y = tensor(N), *dx = tensor(N), *g = tensor(C), *b = tensor(C);
  A *mean = stats(R), *rstd = stats(R), *dg = stats(C), *db = stats(C);
  auto fresh_inputs = [&] {
    upload_at(dev, vx, x); upload_at(dev, vr, r); upload_at(dev, vdy, dy); upload_at(dev, vg, g); upload_at(dev, vb, b);
  };

  {  // add (residual) and GELU forward / backward over rows * cols elements
    std::vector<T> ref_add(N), ref_y(N), ref_dx(N);
    twin::add(vx.data(), vr.data(), rows * cols, ref_add.data());
    twin::gelu_forward<T>(vx.data(), rows * cols, ref_y.data());
    twin::gelu_backward<T>(vdy.data(), vx.data(), rows * cols, ref_dx.data());
    auto run = [&] {
      fresh_inputs(); nan_fill_at(dev, y, N); nan_fill_at(dev, dx, N);
      dev.add(x, r, rows * cols, y);
      auto sum = download_at(dev, y, N);
      nan_fill_at(dev, y, N);
      dev.gelu_forward(x, rows * cols, y);
      dev.gelu_backward(dy, x, rows * cols, dx);
      return std::tuple{sum, download_at(dev, y, N), download_at(dev, dx, N)};
    };
    auto r1 = run(), r2 = run();
    compare(h, shape_label<T>("add", shape), "out", std::get<0>(r1), std::get<0>(r2), ref_add, tol);
    compare(h, shape_label<T>("gelu_forward", shape), "y", std::get<1>(r1), std::get<1>(r2), ref_y, tol);
    compare(h, shape_label<T>("gelu_backward", shape), "dx", std::get<2>(r1), std::get<2>(r2), ref_dx, tol);
  }
  {  // bias_add, bias_grad (accumulating into dbias)
    std::vector<T> ref_y = vx;
    twin::bias_add(ref_y.data(), vb.data(), rows, cols);
    std::vector<A> ref_db = vdb;
    twin::bias_grad(vdy.data(), rows, cols, ref_db.data());
    auto run = [&] {
      fresh_inputs(); upload_at(dev, vdb, db);
      dev.bias_grad(dy, rows, cols, db);
      dev.bias_add(x, b, rows, cols);
      return std::pair{download_at(dev, x, N), download_at(dev, db, C)};
    };
    auto r1 = run(), r2 = run();
    compare(h, shape_label<T>("bias_add", shape), "y", r1.first, r2.first, ref_y, tol);
    compare(h, shape_label<T>("bias_grad", shape), "dbias (accumulated)", r1.second, r2.second, ref_db, tol);
  }
  {  // layernorm forward / backward
    const A eps = A(1e-5);
    std::vector<T> ry(N), rdx(N);
    std::vector<A> rmean(R), rrstd(R), rdg(C, A(0)), rdb(C, A(0));
    twin::layernorm_forward<T>(vx.data(), vg.data(), vb.data(), rows, cols, eps, ry.data(), rmean.data(), rrstd.data());
    twin::layernorm_backward<T>(vdy.data(), vx.data(), vg.data(), rmean.data(), rrstd.data(), rows, cols, rdx.data(), rdg.data(),
                                rdb.data());
    auto run = [&] {
      fresh_inputs();
      nan_fill_at(dev, y, N); nan_fill_at(dev, dx, N); nan_fill_at(dev, mean, R); nan_fill_at(dev, rstd, R);
      nan_fill_at(dev, dg, C); nan_fill_at(dev, db, C);
      dev.layernorm_forward(x, g, b, rows, cols, eps, y, mean, rstd);
      dev.layernorm_backward(dy, x, g, mean, rstd, rows, cols, dx, dg, db);
      return std::tuple{download_at(dev, y, N), download_at(dev, mean, R), download_at(dev, rstd, R), download_at(dev, dx, N),
                        download_at(dev, dg, C), download_at(dev, db, C)};
    };
    auto r1 = run(), r2 = run();
    const std::string f = shape_label<T>("layernorm_forward", shape), bk = shape_label<T>("layernorm_backward", shape);
    compare(h, f, "y", std::get<0>(r1), std::get<0>(r2), ry, tol);
    compare(h, f, "mean", std::get<1>(r1), std::get<1>(r2), rmean, tol);
    compare(h, f, "rstd", std::get<2>(r1), std::get<2>(r2), rrstd, tol);
    compare(h, bk, "dx", std::get<3>(r1), std::get<3>(r2), rdx, tol);
    compare(h, bk, "dg", std::get<4>(r1), std::get<4>(r2), rdg, tol);
    compare(h, bk, "db", std::get<5>(r1), std::get<5>(r2), rdb, tol);
  }
  // The norms fused with the residual add, in place as the layers call them: the sum overwrites x,
  // and the input gradient overwrites the residual gradient (dr holds vr on entry).
  for (const bool layer : {true, false}) {
    const A eps = A(1e-5);
    std::vector<T> rsum(N), ry(N), rdx(N);
    std::vector<A> rmean(R), rrstd(R), rdg(C, A(0)), rdb(C, A(0)), rds(C, A(0.5));
    T* dr = tensor(N);
    A* ds = stats(C);  // dresidual's column sums, added to 0.5 each (layernorm)
    if (layer) {
      twin::layernorm_forward<T>(vx.data(), vg.data(), vb.data(), rows, cols, eps, ry.data(), rmean.data(), rrstd.data(),
                                 vr.data(), rsum.data());
      twin::layernorm_backward<T>(vdy.data(), rsum.data(), vg.data(), rmean.data(), rrstd.data(), rows, cols, rdx.data(),
                                  rdg.data(), rdb.data(), vr.data(), false, rds.data());
    } else {
      twin::rmsnorm_forward<T>(vx.data(), vg.data(), rows, cols, eps, ry.data(), rrstd.data(), vr.data(), rsum.data());
      twin::rmsnorm_backward<T>(vdy.data(), rsum.data(), vg.data(), rrstd.data(), rows, cols, rdx.data(), rdg.data(),
                                vr.data());
    }
    auto run = [&] {
      fresh_inputs(); upload_at(dev, vr, dr);
      nan_fill_at(dev, y, N); nan_fill_at(dev, mean, R); nan_fill_at(dev, rstd, R); nan_fill_at(dev, dg, C); nan_fill_at(dev, db, C);
      if (layer) {
        dev.fill(ds, static_cast<index_t>(C), 0.5);
        dev.layernorm_forward(x, g, b, rows, cols, eps, y, mean, rstd, r, x);
        dev.layernorm_backward(dy, x, g, mean, rstd, rows, cols, dr, dg, db, dr, false, ds);
      } else {
        dev.rmsnorm_forward(x, g, rows, cols, eps, y, rstd, r, x);
        dev.rmsnorm_backward(dy, x, g, rstd, rows, cols, dr, dg, dr);
      }
      return std::tuple{download_at(dev, x, N), download_at(dev, y, N), download_at(dev, rstd, R), download_at(dev, dr, N),
                        download_at(dev, dg, C), download_at(dev, mean, R), download_at(dev, db, C), download_at(dev, ds, C)};
    };
    auto r1 = run(), r2 = run();
    const std::string name = layer ? "layernorm" : "rmsnorm";
    const std::string f = shape_label<T>(name + "_forward + residual", shape), bk = shape_label<T>(name + "_backward + dresidual", shape);
    compare(h, f, "sum (in place of x)", std::get<0>(r1), std::get<0>(r2), rsum, tol);
    compare(h, f, "y", std::get<1>(r1), std::get<1>(r2), ry, tol);
    compare(h, f, "rstd", std::get<2>(r1), std::get<2>(r2), rrstd, tol);
    compare(h, bk, "dx (in place of dresidual)", std::get<3>(r1), std::get<3>(r2), rdx, tol);
    compare(h, bk, "dg", std::get<4>(r1), std::get<4>(r2), rdg, tol);
    if (layer) {
      compare(h, f, "mean", std::get<5>(r1), std::get<5>(r2), rmean, tol);
      compare(h, bk, "db", std::get<6>(r1), std::get<6>(r2), rdb, tol);
      compare(h, bk, "dresidual's column sums (added)", std::get<7>(r1), std::get<7>(r2), rds, tol);
    }
  }
  {  // rmsnorm forward / backward
    const A eps = A(1e-6);
    std::vector<T> ry(N), rdx(N);
    std::vector<A> rrstd(R), rdg(C, A(0));
    twin::rmsnorm_forward<T>(vx.data(), vg.data(), rows, cols, eps, ry.data(), rrstd.data());
    twin::rmsnorm_backward<T>(vdy.data(), vx.data(), vg.data(), rrstd.data(), rows, cols, rdx.data(), rdg.data());
    auto run = [&] {
      fresh_inputs();
      nan_fill_at(dev, y, N); nan_fill_at(dev, dx, N); nan_fill_at(dev, rstd, R); nan_fill_at(dev, dg, C);
      dev.rmsnorm_forward(x, g, rows, cols, eps, y, rstd);
      dev.rmsnorm_backward(dy, x, g, rstd, rows, cols, dx, dg);
      return std::tuple{download_at(dev, y, N), download_at(dev, rstd, R), download_at(dev, dx, N), download_at(dev, dg, C)};
    };
    auto r1 = run(), r2 = run();
    const std::string f = shape_label<T>("rmsnorm_forward", shape), bk = shape_label<T>("rmsnorm_backward", shape);
    compare(h, f, "y", std::get<0>(r1), std::get<0>(r2), ry, tol);
    compare(h, f, "rstd", std::get<1>(r1), std::get<1>(r2), rrstd, tol);
    compare(h, bk, "dx", std::get<2>(r1), std::get<2>(r2), rdx, tol);
    compare(h, bk, "dg", std::get<3>(r1), std::get<3>(r2), rdg, tol);
  }
  {  // SwiGLU forward / backward over gate_up [rows, 2 cols]: 16-byte vectors where cols is a multiple of
     // the width and the tensors are aligned, one element a thread otherwise (inputs drawn last, so the
     // checks above keep theirs)
    auto vgu = rng.template uniform<T>(2 * N, -3, 3), vd = rng.template uniform<T>(N);
    std::vector<T> ref_y(N), ref_dgu(2 * N);
    twin::swiglu_forward<T>(vgu.data(), rows, cols, ref_y.data());
    twin::swiglu_backward<T>(vd.data(), vgu.data(), rows, cols, ref_dgu.data());
    T *gu = tensor(2 * N), *dgu = tensor(2 * N);
    auto run = [&] {
      upload_at(dev, vgu, gu); upload_at(dev, vd, dy); nan_fill_at(dev, y, N); nan_fill_at(dev, dgu, 2 * N);
      dev.swiglu_forward(gu, rows, cols, y);
      dev.swiglu_backward(dy, gu, rows, cols, dgu);
      return std::pair{download_at(dev, y, N), download_at(dev, dgu, 2 * N)};
    };
    auto r1 = run(), r2 = run();
    compare(h, shape_label<T>("swiglu_forward", shape), "y", r1.first, r2.first, ref_y, tol);
    compare(h, shape_label<T>("swiglu_backward", shape), "dgate_up", r1.second, r2.second, ref_dgu, tol);
  }
}

// ---------------------------------------------------------------------------------------------------
// The cross-entropy row kernels on every path: logits and dlogits starting `logits_offset` and
// `dlogits_offset` elements into their allocations (the same offset: 16-byte loads and stores after
// a scalar head; different offsets: the backward writes one element at a time), `local` columns of
// which the first `used` are real (neither need be a multiple of a 16-byte vector), rows down to one.
// This rank is rank 2 holding columns [2 local, 2 local + used) of a vocabulary that ends there; row i
// has its label held here at a random column (i % 4 = 0), before this rank's columns (1), at the last
// used column (2) or at the first column (3). Max and dlogits are checked against the twin in T, the
// sums and the loss against the exact (double) sums.
template <class T>
void test_cross_entropy_paths(harness& h, index_t rows, index_t local, index_t used, index_t logits_offset,
                              index_t dlogits_offset, double label_smoothing) {
  using A = accumulate_t<T>;
  const auto R = static_cast<std::size_t>(rows), N = R * static_cast<std::size_t>(local);
  const index_t begin = 2 * local, vocab = begin + used;
  const double tol = tolerance<T>();
  auto& dev = h.device;
  auto rng = h.fresh();
  auto vlogits = rng.template uniform<T>(N, -6, 6);
  auto held = rng.integers(R, 0, static_cast<std::int32_t>(used - 1)), before = rng.integers(R, 0, static_cast<std::int32_t>(begin - 1));
  std::vector<std::int32_t> vlabels(R);
  for (std::size_t i = 0; i < R; ++i) {
    const index_t cases[4] = {begin + held[i], before[i], begin + used - 1, begin};
    vlabels[i] = static_cast<std::int32_t>(cases[i % 4]);
  }
  auto vdloss = rng.template uniform<A>(R, 0.1, 1.0);
  const A smoothing = A(label_smoothing > 0 ? label_smoothing * double(vocab) / (double(vocab) - 1.0) : 0.0);
  std::vector<A> rmax(R), rsums(3 * R), rloss(R), rlse(R);
  std::vector<T> rdz(N);
  twin::cross_entropy_max(vlogits.data(), rows, local, used, rmax.data());
  twin::cross_entropy_sums(vlogits.data(), rows, local, used, rmax.data(), vlabels.data(), begin, rsums.data());
  twin::cross_entropy_loss(rsums.data(), rmax.data(), rows, vocab, smoothing, rloss.data(), rlse.data());
  twin::cross_entropy_backward(vlogits.data(), rlse.data(), vlabels.data(), begin, rows, local, used, vocab, smoothing,
                               vdloss.data(), rdz.data());
  // The sums and the loss against the twin run in double on the same logits (the exact sums, rounded
  // to A once): over 50257 columns the float twin's own running sum drifts by about n * eps / 2
  // (5e-5 relative), more than the float tolerance, while the kernel's per-thread sums do not.
  if constexpr (!std::is_same_v<T, double>) {
    std::vector<double> logits64(vlogits.begin(), vlogits.end()), max64(R), sums64(3 * R), loss64(R), lse64(R);
    strata::cpu::backend::cross_entropy_max(logits64.data(), rows, local, used, max64.data());
    strata::cpu::backend::cross_entropy_sums(logits64.data(), rows, local, used, max64.data(), vlabels.data(), begin, sums64.data());
    strata::cpu::backend::cross_entropy_loss(sums64.data(), max64.data(), rows, vocab, double(smoothing), loss64.data(), lse64.data());
    rsums.assign(sums64.begin(), sums64.end());
    rloss.assign(loss64.begin(), loss64.end());
  }
  device_vector<T> logits_at(N + static_cast<std::size_t>(logits_offset)), dz_at(N + static_cast<std::size_t>(dlogits_offset));
  T* logits = logits_at.data() + logits_offset;
  T* dz = dz_at.data() + dlogits_offset;
  device_vector<std::int32_t> labels(R);
  device_vector<A> row_max(R), sums(3 * R), loss(R), lse(R), dloss(R);
  auto run = [&] {
    upload_at(dev, vlogits, logits); upload(dev, vlabels, labels); upload(dev, vdloss, dloss);
    nan_fill(dev, row_max); nan_fill(dev, sums); nan_fill(dev, loss); nan_fill(dev, lse); nan_fill_at(dev, dz, N);
    dev.cross_entropy_max(logits, rows, local, used, row_max.data());
    dev.cross_entropy_sums(logits, rows, local, used, row_max.data(), labels.data(), begin, sums.data());
    dev.cross_entropy_loss(sums.data(), row_max.data(), rows, vocab, smoothing, loss.data(), lse.data());
    dev.cross_entropy_backward(logits, lse.data(), labels.data(), begin, rows, local, used, vocab, smoothing, dloss.data(), dz);
    return std::tuple{download(dev, row_max), download(dev, sums), download(dev, loss), download_at(dev, dz, N)};
  };
  auto r1 = run(), r2 = run();
  const std::string dd = "rows=" + std::to_string(rows) + " local=" + std::to_string(local) + " used=" + std::to_string(used) +
                         " offsets=" + std::to_string(logits_offset) + "," + std::to_string(dlogits_offset) +
                         " label_smoothing=" + format("%.1f", label_smoothing);
  compare(h, shape_label<T>("cross_entropy_max", dd), "row_max", std::get<0>(r1), std::get<0>(r2), rmax, tol);
  compare(h, shape_label<T>("cross_entropy_sums", dd), "sums", std::get<1>(r1), std::get<1>(r2), rsums, tol);
  compare(h, shape_label<T>("cross_entropy_loss", dd), "loss", std::get<2>(r1), std::get<2>(r2), rloss, tol);
  compare(h, shape_label<T>("cross_entropy_backward", dd), "dlogits", std::get<3>(r1), std::get<3>(r2), rdz, tol);
  // Padded columns are exactly zero (not just small against the norm).
  std::size_t nonzero = 0;
  for (std::size_t i = 0; i < R; ++i)
    for (index_t j = used; j < local; ++j) nonzero += static_cast<double>(std::get<3>(r1)[i * static_cast<std::size_t>(local) + j]) != 0.0;
  h.results.record(nonzero == 0, shape_label<T>("cross_entropy_backward", dd) + " padded columns: " + std::to_string(nonzero) + " not zero");
}

// The fused forward-backward of a rank holding every column (begin 0) on logits `offset` elements
// into their allocation: losses against the exact (double) twin, the gradient written over the
// logits against the twin's backward in T, padded columns exactly zero. Row i's label is random (i %
// 3 = 0), the last real column (1) or the first (2); more rows than the grid's blocks make each
// block take several rows.
template <class T>
void test_cross_entropy_fused(harness& h, index_t rows, index_t local, index_t used, index_t offset,
                              double label_smoothing) {
  using A = accumulate_t<T>;
  const auto R = static_cast<std::size_t>(rows), N = R * static_cast<std::size_t>(local);
  const index_t vocab = used;
  auto& dev = h.device;
  auto rng = h.fresh();
  auto vlogits = rng.template uniform<T>(N, -6, 6);
  auto random_label = rng.integers(R, 0, static_cast<std::int32_t>(used - 1));
  std::vector<std::int32_t> vlabels(R);
  for (std::size_t i = 0; i < R; ++i) {
    const index_t cases[3] = {random_label[i], used - 1, 0};
    vlabels[i] = static_cast<std::int32_t>(cases[i % 3]);
  }
  auto vdloss = rng.template uniform<A>(R, 0.1, 1.0);
  const A smoothing = A(label_smoothing > 0 ? label_smoothing * double(vocab) / (double(vocab) - 1.0) : 0.0);
  std::vector<A> rloss(R);
  std::vector<T> rdz = vlogits;
  twin::cross_entropy_forward_backward(rdz.data(), vlabels.data(), rows, local, used, vocab, smoothing, vdloss.data(),
                                       rloss.data());
  if constexpr (!std::is_same_v<T, double>) {  // the loss against the exact sums (test_cross_entropy_paths says why)
    std::vector<double> logits64(vlogits.begin(), vlogits.end()), loss64(R), dloss64(vdloss.begin(), vdloss.end());
    twin::cross_entropy_forward_backward(logits64.data(), vlabels.data(), rows, local, used, vocab, double(smoothing),
                                         dloss64.data(), loss64.data());
    rloss.assign(loss64.begin(), loss64.end());
  }
  device_vector<T> logits_at(N + static_cast<std::size_t>(offset));
  T* logits = logits_at.data() + offset;
  device_vector<std::int32_t> labels(R);
  device_vector<A> loss(R), dloss(R);
  auto run = [&] {
    upload_at(dev, vlogits, logits); upload(dev, vlabels, labels); upload(dev, vdloss, dloss); nan_fill(dev, loss);
    dev.cross_entropy_forward_backward(logits, labels.data(), rows, local, used, vocab, smoothing, dloss.data(), loss.data());
    return std::pair{download(dev, loss), download_at(dev, logits, N)};
  };
  auto r1 = run(), r2 = run();
  const std::string dd = "rows=" + std::to_string(rows) + " local=" + std::to_string(local) + " used=" + std::to_string(used) +
                         " offset=" + std::to_string(offset) + " label_smoothing=" + format("%.1f", label_smoothing);
  const double tol = tolerance<T>();
  compare(h, shape_label<T>("cross_entropy_forward_backward", dd), "loss", r1.first, r2.first, rloss, tol);
  compare(h, shape_label<T>("cross_entropy_forward_backward", dd), "dlogits", r1.second, r2.second, rdz, tol);
  std::size_t nonzero = 0;
  for (std::size_t i = 0; i < R; ++i)
    for (index_t j = used; j < local; ++j) nonzero += static_cast<double>(r1.second[i * static_cast<std::size_t>(local) + j]) != 0.0;
  h.results.record(nonzero == 0, shape_label<T>("cross_entropy_forward_backward", dd) + " padded columns: " +
                                     std::to_string(nonzero) + " not zero");
}

// bias_grad at the sizes of a training step, where the one-kernel column sums take more (column tile,
// chunk) items than the device holds blocks, so blocks take several in turn and tiles finish while
// others are read: against the twin, the same bits twice, and the same bits as the two-kernel path
// (kernels::bias_grad without counters: the partials, then sum_partials).
template <class T>
void test_bias_grad_large(harness& h, index_t rows, index_t cols) {
  using A = accumulate_t<T>;
  const auto C = static_cast<std::size_t>(cols), N = static_cast<std::size_t>(rows) * C;
  auto& dev = h.device;
  auto rng = h.fresh();
  const auto vy = rng.template uniform<T>(N);
  const auto vdb = rng.template uniform<A>(C);
  std::vector<A> ref = vdb;
  twin::bias_grad(vy.data(), rows, cols, ref.data());
  device_vector<T> y(N);
  device_vector<A> db(C), workspace(static_cast<std::size_t>(strata::cuda::kernels::column_sum_chunks(rows)) * C);
  upload(dev, vy, y);
  auto run = [&](bool one_kernel) {
    upload(dev, vdb, db);
    if (one_kernel) dev.bias_grad(y.data(), rows, cols, db.data());
    else strata::cuda::kernels::bias_grad<T, A>(y.data(), rows, cols, db.data(), workspace.data(), dev.stream());
    return download(dev, db);
  };
  const auto first = run(true), second = run(true), two_kernels = run(false);
  const std::string label = shape_label<T>("bias_grad", dims(rows, cols));
  compare(h, label, "dbias (one kernel)", first, second, ref, tolerance<T>());
  h.results.record(same_bits(first, two_kernels), label + " one kernel against partials + sum_partials: " +
                                                      (same_bits(first, two_kernels) ? "same bits" : "DIFFERENT bits"));
}

// ---------------------------------------------------------------------------------------------------
template <class T>
void test_rows(harness& h, index_t rows, index_t cols) {
  using A = accumulate_t<T>;
  const auto R = static_cast<std::size_t>(rows), C = static_cast<std::size_t>(cols), N = R * C;
  const double tol = tolerance<T>();
  auto& dev = h.device;
  {  // bias_add, bias_grad
    auto rng = h.fresh();
    auto vy = rng.template uniform<T>(N), vb = rng.template uniform<T>(C);
    auto vdb = rng.template uniform<A>(C);
    std::vector<T> ref_y = vy;
    twin::bias_add(ref_y.data(), vb.data(), rows, cols);
    std::vector<A> ref_db = vdb;
    twin::bias_grad(vy.data(), rows, cols, ref_db.data());
    device_vector<T> y(N), b(C);
    device_vector<A> db(C);
    auto run = [&] {
      upload(dev, vy, y); upload(dev, vb, b); upload(dev, vdb, db);
      dev.bias_grad(y.data(), rows, cols, db.data());
      dev.bias_add(y.data(), b.data(), rows, cols);
      return std::pair{download(dev, y), download(dev, db)};
    };
    auto r1 = run(), r2 = run();
    compare(h, shape_label<T>("bias_add", dims(rows, cols)), "y", r1.first, r2.first, ref_y, tol);
    compare(h, shape_label<T>("bias_grad", dims(rows, cols)), "dbias (accumulated)", r1.second, r2.second, ref_db, tol);
  }
  {  // slice_columns
    const index_t begin = cols / 3, width = cols - begin - (cols > 2 ? 1 : 0);
    auto rng = h.fresh();
    auto vin = rng.template uniform<T>(N);
    std::vector<T> ref(R * static_cast<std::size_t>(width));
    twin::slice_columns(vin.data(), rows, cols, begin, width, ref.data());
    device_vector<T> in(N), out(ref.size());
    auto run = [&] { upload(dev, vin, in); nan_fill(dev, out); dev.slice_columns(in.data(), rows, cols, begin, width, out.data()); return download(dev, out); };
    auto r1 = run(), r2 = run();
    compare(h, shape_label<T>("slice_columns", dims(rows, cols) + " begin=" + std::to_string(begin)), "out", r1, r2, ref, 0.0);
  }
  {  // copy_columns: columns begin.. of [rows, cols] into columns 1.. of [rows, cols + 2], the others kept
    const index_t begin = cols / 3, width = cols - begin, wide = cols + 2;
    auto rng = h.fresh();
    auto vin = rng.template uniform<T>(N), vout = rng.template uniform<T>(R * static_cast<std::size_t>(wide));
    std::vector<T> ref = vout;
    twin::copy_columns(vin.data() + begin, cols, rows, width, ref.data() + 1, wide);
    device_vector<T> in(N), out(ref.size());
    auto run = [&] {
      upload(dev, vin, in);
      upload(dev, vout, out);
      dev.copy_columns(in.data() + begin, cols, rows, width, out.data() + 1, wide);
      return download(dev, out);
    };
    auto r1 = run(), r2 = run();
    compare(h, shape_label<T>("copy_columns", dims(rows, cols) + " begin=" + std::to_string(begin)), "out", r1, r2, ref, 0.0);
  }
  {  // unstack_columns: 3 parts of [rows, cols]
    auto rng = h.fresh();
    auto vin = rng.template uniform<T>(3 * N);
    std::vector<T> ref(3 * N);
    twin::unstack_columns(vin.data(), 3, rows, cols, ref.data());
    device_vector<T> in(3 * N), out(3 * N);
    auto run = [&] { upload(dev, vin, in); nan_fill(dev, out); dev.unstack_columns(in.data(), 3, rows, cols, out.data()); return download(dev, out); };
    auto r1 = run(), r2 = run();
    compare(h, shape_label<T>("unstack_columns", dims(rows, cols) + " parts=3"), "out", r1, r2, ref, 0.0);
  }
  {  // qkv_split / qkv_merge: groups 2, heads_per_group 3, d = cols
    const index_t groups = 2, hpg = 3, d = cols;
    const std::size_t nq = R * groups * hpg * C, nk = R * groups * C, total = nq + 2 * nk;
    auto rng = h.fresh();
    auto vqkv = rng.template uniform<T>(total);
    std::vector<T> rq(nq), rk(nk), rv(nk), rqkv(total);
    twin::qkv_split(vqkv.data(), rows, groups, hpg, d, rq.data(), rk.data(), rv.data());
    twin::qkv_merge(rq.data(), rk.data(), rv.data(), rows, groups, hpg, d, rqkv.data());
    device_vector<T> qkv(total), q(nq), k(nk), v(nk), back(total);
    auto run = [&] {
      upload(dev, vqkv, qkv); nan_fill(dev, q); nan_fill(dev, k); nan_fill(dev, v); nan_fill(dev, back);
      dev.qkv_split(qkv.data(), rows, groups, hpg, d, q.data(), k.data(), v.data());
      dev.qkv_merge(q.data(), k.data(), v.data(), rows, groups, hpg, d, back.data());
      return std::tuple{download(dev, q), download(dev, k), download(dev, v), download(dev, back)};
    };
    auto r1 = run(), r2 = run();
    const std::string label = shape_label<T>("qkv_split", dims(rows, cols) + " groups=2 heads_per_group=3");
    compare(h, label, "q", std::get<0>(r1), std::get<0>(r2), rq, 0.0);
    compare(h, label, "k", std::get<1>(r1), std::get<1>(r2), rk, 0.0);
    compare(h, label, "v", std::get<2>(r1), std::get<2>(r2), rv, 0.0);
    compare(h, shape_label<T>("qkv_merge", dims(rows, cols) + " groups=2 heads_per_group=3"), "dqkv", std::get<3>(r1),
            std::get<3>(r2), rqkv, 0.0);
    compare(h, shape_label<T>("qkv_merge", dims(rows, cols)), "merge(split(qkv)) == qkv", std::get<3>(r1), std::get<3>(r2), vqkv, 0.0);
  }
  {  // layernorm forward / backward
    auto rng = h.fresh();
    auto vx = rng.template uniform<T>(N, -2, 3), vg = rng.template uniform<T>(C, 0.5, 1.5), vb = rng.template uniform<T>(C),
         vdy = rng.template uniform<T>(N);
    const A eps = A(1e-5);
    std::vector<T> ry(N), rdx(N);
    std::vector<A> rmean(R), rrstd(R), rdg(C, A(0)), rdb(C, A(0));
    twin::layernorm_forward<T>(vx.data(), vg.data(), vb.data(), rows, cols, eps, ry.data(), rmean.data(), rrstd.data());
    twin::layernorm_backward<T>(vdy.data(), vx.data(), vg.data(), rmean.data(), rrstd.data(), rows, cols, rdx.data(),
                                       rdg.data(), rdb.data());
    device_vector<T> x(N), g(C), b(C), dy(N), y(N), dx(N);
    device_vector<A> mean(R), rstd(R), dg(C), db(C);
    auto run = [&] {
      upload(dev, vx, x); upload(dev, vg, g); upload(dev, vb, b); upload(dev, vdy, dy);
      nan_fill(dev, y); nan_fill(dev, dx); nan_fill(dev, mean); nan_fill(dev, rstd); nan_fill(dev, dg); nan_fill(dev, db);
      dev.layernorm_forward(x.data(), g.data(), b.data(), rows, cols, eps, y.data(), mean.data(), rstd.data());
      dev.layernorm_backward(dy.data(), x.data(), g.data(), mean.data(), rstd.data(), rows, cols, dx.data(), dg.data(), db.data());
      return std::tuple{download(dev, y), download(dev, mean), download(dev, rstd), download(dev, dx), download(dev, dg), download(dev, db)};
    };
    auto r1 = run(), r2 = run();
    const std::string f = shape_label<T>("layernorm_forward", dims(rows, cols)), bk = shape_label<T>("layernorm_backward", dims(rows, cols));
    compare(h, f, "y", std::get<0>(r1), std::get<0>(r2), ry, tol);
    compare(h, f, "mean", std::get<1>(r1), std::get<1>(r2), rmean, tol);
    compare(h, f, "rstd", std::get<2>(r1), std::get<2>(r2), rrstd, tol);
    compare(h, bk, "dx", std::get<3>(r1), std::get<3>(r2), rdx, tol);
    compare(h, bk, "dg", std::get<4>(r1), std::get<4>(r2), rdg, tol);
    compare(h, bk, "db", std::get<5>(r1), std::get<5>(r2), rdb, tol);
  }
  {  // rmsnorm forward / backward
    auto rng = h.fresh();
    auto vx = rng.template uniform<T>(N, -2, 3), vg = rng.template uniform<T>(C, 0.5, 1.5), vdy = rng.template uniform<T>(N);
    // At h = 1, dx = rstd gy (1 - xhat^2) and 1 - xhat^2 = eps rstd^2: with a small eps the result is
    // a cancellation that leaves only rounding noise on either side, so h = 1 uses a unit eps.
    const A eps = A(cols == 1 ? 1.0 : 1e-6);
    std::vector<T> ry(N), rdx(N);
    std::vector<A> rrstd(R), rdg(C, A(0));
    twin::rmsnorm_forward<T>(vx.data(), vg.data(), rows, cols, eps, ry.data(), rrstd.data());
    twin::rmsnorm_backward<T>(vdy.data(), vx.data(), vg.data(), rrstd.data(), rows, cols, rdx.data(), rdg.data());
    device_vector<T> x(N), g(C), dy(N), y(N), dx(N);
    device_vector<A> rstd(R), dg(C);
    auto run = [&] {
      upload(dev, vx, x); upload(dev, vg, g); upload(dev, vdy, dy);
      nan_fill(dev, y); nan_fill(dev, dx); nan_fill(dev, rstd); nan_fill(dev, dg);
      dev.rmsnorm_forward(x.data(), g.data(), rows, cols, eps, y.data(), rstd.data());
      dev.rmsnorm_backward(dy.data(), x.data(), g.data(), rstd.data(), rows, cols, dx.data(), dg.data());
      return std::tuple{download(dev, y), download(dev, rstd), download(dev, dx), download(dev, dg)};
    };
    auto r1 = run(), r2 = run();
    const std::string f = shape_label<T>("rmsnorm_forward", dims(rows, cols)), bk = shape_label<T>("rmsnorm_backward", dims(rows, cols));
    compare(h, f, "y", std::get<0>(r1), std::get<0>(r2), ry, tol);
    compare(h, f, "rstd", std::get<1>(r1), std::get<1>(r2), rrstd, tol);
    compare(h, bk, "dx", std::get<2>(r1), std::get<2>(r2), rdx, tol);
    compare(h, bk, "dg", std::get<3>(r1), std::get<3>(r2), rdg, tol);
  }
  {  // rope forward / backward: x [s = rows, n = 3, d = 2 cols], offset 5
    const index_t s = rows, heads = 3, d = 2 * cols;
    const std::size_t total = static_cast<std::size_t>(s * heads * d);
    auto rng = h.fresh();
    auto vx = rng.template uniform<T>(total);
    std::vector<T> rf = vx, rb = vx;
    twin::rope_forward(rf.data(), s, heads, d, 10000.0, 5);
    twin::rope_backward(rb.data(), s, heads, d, 10000.0, 5);
    device_vector<T> x(total);
    auto run = [&](bool inverse) {
      upload(dev, vx, x);
      if (inverse) dev.rope_backward(x.data(), s, heads, d, 10000.0, 5);
      else dev.rope_forward(x.data(), s, heads, d, 10000.0, 5);
      return download(dev, x);
    };
    auto f1 = run(false), f2 = run(false), b1 = run(true), b2 = run(true);
    const std::string dd = "s=" + std::to_string(s) + " n=3 d=" + std::to_string(d);
    compare(h, shape_label<T>("rope_forward", dd), "x", f1, f2, rf, tol);
    compare(h, shape_label<T>("rope_backward", dd), "dx", b1, b2, rb, tol);
  }
  {  // embedding forward / backward: n = rows tokens over a vocabulary of 50, this rank holds rows [10, 35)
    const index_t n = rows, h_ = cols, row_begin = 10, rows_local = 25;
    auto rng = h.fresh();
    auto vtokens = rng.integers(R, 0, 49);
    auto vweight = rng.template uniform<T>(static_cast<std::size_t>(rows_local) * C), vdout = rng.template uniform<T>(N);
    auto vdw = rng.template uniform<A>(static_cast<std::size_t>(rows_local) * C);
    std::vector<T> rout(N);
    twin::embedding_forward(vtokens.data(), n, vweight.data(), row_begin, rows_local, h_, rout.data());
    std::vector<A> rdw = vdw;
    twin::embedding_backward(vtokens.data(), n, vdout.data(), row_begin, rows_local, h_, rdw.data());
    device_vector<std::int32_t> tokens(R);
    device_vector<T> weight(vweight.size()), dout(N), out(N);
    device_vector<A> dw(vdw.size());
    auto run = [&] {
      upload(dev, vtokens, tokens); upload(dev, vweight, weight); upload(dev, vdout, dout); upload(dev, vdw, dw); nan_fill(dev, out);
      dev.embedding_forward(tokens.data(), n, weight.data(), row_begin, rows_local, h_, out.data());
      dev.embedding_backward(tokens.data(), n, dout.data(), row_begin, rows_local, h_, dw.data());
      return std::pair{download(dev, out), download(dev, dw)};
    };
    auto r1 = run(), r2 = run();
    const std::string dd = "n=" + std::to_string(n) + " h=" + std::to_string(h_) + " rows [10, 35) of 50";
    compare(h, shape_label<T>("embedding_forward", dd), "out", r1.first, r2.first, rout, 0.0);
    compare(h, shape_label<T>("embedding_backward", dd), "dweight (accumulated)", r1.second, r2.second, rdw, tol);
  }
  {  // position_add / position_grad: x [s = rows, b = 3, h = cols], table of rows + 4 positions, first = 2
    const index_t s = rows, b = 3, h_ = cols, first = 2, positions = rows + 4;
    const std::size_t total = static_cast<std::size_t>(s * b * h_), table = static_cast<std::size_t>(positions * h_);
    auto rng = h.fresh();
    auto vx = rng.template uniform<T>(total), vw = rng.template uniform<T>(table), vdy = rng.template uniform<T>(total);
    auto vdw = rng.template uniform<A>(table);
    std::vector<T> rx = vx;
    twin::position_add(rx.data(), vw.data(), s, b, h_, first);
    std::vector<A> rdw = vdw;
    twin::position_grad(vdy.data(), s, b, h_, first, rdw.data());
    device_vector<T> x(total), w(table), dy(total);
    device_vector<A> dw(table);
    auto run = [&] {
      upload(dev, vx, x); upload(dev, vw, w); upload(dev, vdy, dy); upload(dev, vdw, dw);
      dev.position_add(x.data(), w.data(), s, b, h_, first);
      dev.position_grad(dy.data(), s, b, h_, first, dw.data());
      return std::pair{download(dev, x), download(dev, dw)};
    };
    auto r1 = run(), r2 = run();
    const std::string dd = "s=" + std::to_string(s) + " b=3 h=" + std::to_string(h_);
    compare(h, shape_label<T>("position_add", dd), "x", r1.first, r2.first, rx, tol);
    compare(h, shape_label<T>("position_grad", dd), "dweight (accumulated)", r1.second, r2.second, rdw, tol);
  }
  // cross-entropy: rank 1 of 2 holds columns [local, 2 local), the last fifth of them padding; the
  // entry points take the smoothing factor s = a K / (K - 1) of label smoothing a (the layer's).
  for (const double label_smoothing : {0.0, 0.1}) {
    const index_t local = cols, used = cols - cols / 5, begin = local, vocab = begin + used;
    auto rng = h.fresh();
    auto vlogits = rng.template uniform<T>(N, -4, 4);
    auto vlabels = rng.integers(R, 0, static_cast<std::int32_t>(vocab - 1));
    auto vdloss = rng.template uniform<A>(R, 0.1, 1.0);
    std::vector<A> rmax(R), rsums(3 * R), rloss(R), rlse(R);
    std::vector<T> rdz(N);
    const double smoothing = label_smoothing > 0 ? label_smoothing * double(vocab) / (double(vocab) - 1.0) : 0.0;
    const A a = A(smoothing);
    twin::cross_entropy_max(vlogits.data(), rows, local, used, rmax.data());
    twin::cross_entropy_sums(vlogits.data(), rows, local, used, rmax.data(), vlabels.data(), begin, rsums.data());
    twin::cross_entropy_loss(rsums.data(), rmax.data(), rows, vocab, a, rloss.data(), rlse.data());
    twin::cross_entropy_backward(vlogits.data(), rlse.data(), vlabels.data(), begin, rows, local, used, vocab, a,
                                vdloss.data(), rdz.data());
    device_vector<T> logits(N), dz(N), in_place(N);
    device_vector<std::int32_t> labels(R);
    device_vector<A> row_max(R), sums(3 * R), loss(R), lse(R), dloss(R);
    auto run = [&] {
      upload(dev, vlogits, logits); upload(dev, vlabels, labels); upload(dev, vdloss, dloss); upload(dev, vlogits, in_place);
      nan_fill(dev, row_max); nan_fill(dev, sums); nan_fill(dev, loss); nan_fill(dev, lse); nan_fill(dev, dz);
      dev.cross_entropy_max(logits.data(), rows, local, used, row_max.data());
      dev.cross_entropy_sums(logits.data(), rows, local, used, row_max.data(), labels.data(), begin, sums.data());
      dev.cross_entropy_loss(sums.data(), row_max.data(), rows, vocab, a, loss.data(), lse.data());
      dev.cross_entropy_backward(logits.data(), lse.data(), labels.data(), begin, rows, local, used, vocab, a,
                                 dloss.data(), dz.data());
      // the chunked classifier's form: d logits written over the logits
      dev.cross_entropy_backward(in_place.data(), lse.data(), labels.data(), begin, rows, local, used, vocab, a,
                                 dloss.data(), in_place.data());
      return std::tuple{download(dev, row_max), download(dev, sums), download(dev, loss), download(dev, lse), download(dev, dz),
                        download(dev, in_place)};
    };
    auto r1 = run(), r2 = run();
    const std::string dd = dims(rows, cols) + " used=" + std::to_string(used) + " label_smoothing=" + format("%.1f", label_smoothing);
    compare(h, shape_label<T>("cross_entropy_max", dd), "row_max", std::get<0>(r1), std::get<0>(r2), rmax, tol);
    compare(h, shape_label<T>("cross_entropy_sums", dd), "sums", std::get<1>(r1), std::get<1>(r2), rsums, tol);
    compare(h, shape_label<T>("cross_entropy_loss", dd), "loss", std::get<2>(r1), std::get<2>(r2), rloss, tol);
    compare(h, shape_label<T>("cross_entropy_loss", dd), "lse", std::get<3>(r1), std::get<3>(r2), rlse, tol);
    compare(h, shape_label<T>("cross_entropy_backward", dd), "dlogits", std::get<4>(r1), std::get<4>(r2), rdz, tol);
    compare(h, shape_label<T>("cross_entropy_backward", dd + " in place"), "dlogits", std::get<5>(r1), std::get<5>(r2),
            rdz, tol);
    h.results.record(same_bits(std::get<5>(r1), std::get<4>(r1)),
                     shape_label<T>("cross_entropy_backward", dd) + " in place: the bits of the out-of-place call");
  }
  {  // masked_loss_sum over rows * cols losses, mask of 0 / 1
    auto rng = h.fresh();
    auto vloss = rng.template uniform<A>(N, 0, 10);
    auto bits = rng.integers(N, 0, 1);
    std::vector<A> vmask(N);
    for (std::size_t i = 0; i < N; ++i) vmask[i] = A(bits[i]);
    std::vector<double> ref(1);
    twin::masked_loss_sum(vloss.data(), vmask.data(), static_cast<index_t>(N), ref.data());
    device_vector<A> loss(N), mask(N);
    device_vector<double> out(1);
    auto run = [&] {
      upload(dev, vloss, loss); upload(dev, vmask, mask); nan_fill(dev, out);
      dev.masked_loss_sum(loss.data(), mask.data(), static_cast<index_t>(N), out.data());
      return download(dev, out);
    };
    auto r1 = run(), r2 = run();
    compare(h, "masked_loss_sum<" + type_name<A>() + "> n=" + std::to_string(N), "out", r1, r2, ref, tolerance<double>() * 10);
  }
}

// adamw_step_many over 30 parameters (two launches of at most 24), some without weight decay, against
// the single-parameter reference on each.
template <class T>
void test_adamw_many(harness& h) {
  using A = accumulate_t<T>;
  const std::vector<index_t> sizes{1, 7, 769, 4095, 4096, 4097, 100003, 3, 0, 12345};
  strata::AdamWStep<A> step{A(2e-3), A(0.9), A(0.95), A(0.1), A(0.05), A(1e-8), A(2e-3 * 0.1), A(1 - std::pow(0.9, 5)),
                          A(1 - std::pow(0.95, 5))};
  struct host_param {
    std::vector<A> main, m, v, g;
    std::vector<T> value;
    bool decay;
  };
  std::vector<host_param> params;
  auto rng = h.fresh();
  for (int i = 0; i < 30; ++i) {
    const auto n = static_cast<std::size_t>(sizes[i % sizes.size()]);
    params.push_back({rng.template uniform<A>(n), rng.template uniform<A>(n, -0.1, 0.1), rng.template uniform<A>(n, 0, 0.01),
                      rng.template uniform<A>(n), std::vector<T>(n), i % 3 != 0});
  }
  std::vector<std::unique_ptr<device_vector<A>>> state;
  std::vector<std::unique_ptr<device_vector<T>>> values;
  std::vector<strata::cuda::kernels::adamw_tensor<T, A>> tensors;
  for (auto& p : params) {
    const std::size_t n = p.main.size();
    for (int j = 0; j < 4; ++j) state.push_back(std::make_unique<device_vector<A>>(n));
    values.push_back(std::make_unique<device_vector<T>>(n));
    auto* s = &state[state.size() - 4];
    tensors.push_back({s[0]->data(), s[1]->data(), s[2]->data(), s[3]->data(), values.back()->data(),
                       static_cast<index_t>(n), p.decay});
  }
  // prescale: the gradients are multiplied by it on the device (scale_by) before the step.
  auto run = [&](const strata::AdamWStep<A>& step, const double* prescale = nullptr) {
    for (std::size_t i = 0; i < params.size(); ++i) {
      upload(h.device, params[i].main, *state[4 * i]); upload(h.device, params[i].m, *state[4 * i + 1]);
      upload(h.device, params[i].v, *state[4 * i + 2]); upload(h.device, params[i].g, *state[4 * i + 3]);
      if (prescale) h.device.scale_by<A>(state[4 * i + 3]->data(), static_cast<index_t>(params[i].g.size()), prescale);
      nan_fill(h.device, *values[i]);
    }
    h.device.adamw_step_many<T>(std::span<const strata::cuda::kernels::adamw_tensor<T, A>>(tensors), step);
    std::vector<A> main_out;
    std::vector<T> value_out;
    for (std::size_t i = 0; i < params.size(); ++i) {
      auto a = download(h.device, *state[4 * i]);
      auto v = download(h.device, *values[i]);
      main_out.insert(main_out.end(), a.begin(), a.end());
      value_out.insert(value_out.end(), v.begin(), v.end());
    }
    return std::pair{main_out, value_out};
  };
  std::vector<A> ref_main;
  std::vector<T> ref_value;
  for (auto p : params) {
    auto one = step;
    if (!p.decay) one.decay = A(0);
    twin::adamw_step<T>(p.main.data(), p.m.data(), p.v.data(), p.g.data(), p.value.data(), static_cast<index_t>(p.main.size()), one);
    ref_main.insert(ref_main.end(), p.main.begin(), p.main.end());
    ref_value.insert(ref_value.end(), p.value.begin(), p.value.end());
  }
  auto r1 = run(step), r2 = run(step);
  const std::string label = "adamw_step_many<" + type_name<T>() + "> 30 parameters, every third without decay";
  compare(h, label, "main", r1.first, r2.first, ref_main, tolerance<T>());
  compare(h, label, "value", r1.second, r2.second, ref_value, tolerance<T>());
  // skip_unless_finite on the device: NaN or infinity there leaves every main copy as it was; a
  // finite value gives the step above, bit for bit.
  std::vector<A> initial_main;
  for (const auto& p : params) initial_main.insert(initial_main.end(), p.main.begin(), p.main.end());
  device_vector<double> gate(1);
  for (double g : {std::nan(""), std::numeric_limits<double>::infinity(), 3.5}) {
    upload(h.device, std::vector<double>{g}, gate);
    auto gated = step;
    gated.skip_unless_finite = gate.data();
    auto r = run(gated);
    const bool skip = !std::isfinite(g);
    const auto& expected = skip ? initial_main : r1.first;
    std::size_t differ = 0;
    for (std::size_t i = 0; i < expected.size(); ++i) differ += std::memcmp(&r.first[i], &expected[i], sizeof(A)) != 0;
    h.results.record(differ == 0, label + (skip ? ", skip_unless_finite non-finite: nothing changes"
                                                : ", skip_unless_finite finite: the same bits as without it") +
                                      " (" + std::to_string(differ) + " main values differ)");
  }
  // grad_scale (the clipping factor read by the kernel): the bits of scale_by on the gradients
  // followed by the step without it; a factor of 1 gives the plain step's bits.
  device_vector<double> factor(1);
  for (double f : {0.3718, 1.0, 1e-3}) {
    upload(h.device, std::vector<double>{f}, factor);
    auto scaled = step;
    scaled.grad_scale = factor.data();
    const auto fused = run(scaled);
    const auto separate = run(step, factor.data());
    std::size_t differ = 0;
    for (std::size_t i = 0; i < fused.first.size(); ++i) differ += std::memcmp(&fused.first[i], &separate.first[i], sizeof(A)) != 0;
    for (std::size_t i = 0; i < fused.second.size(); ++i)
      differ += std::memcmp(&fused.second[i], &separate.second[i], sizeof(T)) != 0;
    if (f == 1.0)
      for (std::size_t i = 0; i < fused.first.size(); ++i) differ += std::memcmp(&fused.first[i], &r1.first[i], sizeof(A)) != 0;
    h.results.record(differ == 0, label + ", grad_scale " + std::to_string(f) +
                                      ": the bits of scale_by then the step (" + std::to_string(differ) + " values differ)");
  }
  // The 16-byte path (aligned tensors, above) against a float at a time: adamw_step per parameter,
  // and adamw_step_many on copies one element past an aligned start (no vector loads): the same bits.
  std::vector<std::unique_ptr<device_vector<A>>> shifted_state;
  std::vector<std::unique_ptr<device_vector<T>>> shifted_values;
  std::vector<strata::cuda::kernels::adamw_tensor<T, A>> shifted;
  for (auto& p : params) {
    const std::size_t n = p.main.size();
    std::vector<A> padded(n + 1, A(0));
    for (int j = 0; j < 4; ++j) {
      const std::vector<A>& from = j == 0 ? p.main : j == 1 ? p.m : j == 2 ? p.v : p.g;
      std::copy(from.begin(), from.end(), padded.begin() + 1);
      shifted_state.push_back(std::make_unique<device_vector<A>>(n + 1));
      upload(h.device, padded, *shifted_state.back());
    }
    shifted_values.push_back(std::make_unique<device_vector<T>>(n + 1));
    auto* s = &shifted_state[shifted_state.size() - 4];
    shifted.push_back({s[0]->data() + 1, s[1]->data() + 1, s[2]->data() + 1, s[3]->data() + 1, shifted_values.back()->data() + 1,
                       static_cast<index_t>(n), p.decay});
  }
  h.device.adamw_step_many<T>(std::span<const strata::cuda::kernels::adamw_tensor<T, A>>(shifted), step);
  std::vector<A> shifted_main, single_main;
  std::vector<T> shifted_value, single_value;
  for (std::size_t i = 0; i < params.size(); ++i) {
    auto a = download(h.device, *shifted_state[4 * i]);
    auto v = download(h.device, *shifted_values[i]);
    shifted_main.insert(shifted_main.end(), a.begin() + 1, a.end());
    shifted_value.insert(shifted_value.end(), v.begin() + 1, v.end());
    const auto& p = params[i];
    upload(h.device, p.main, *state[4 * i]); upload(h.device, p.m, *state[4 * i + 1]);
    upload(h.device, p.v, *state[4 * i + 2]); upload(h.device, p.g, *state[4 * i + 3]);
    auto one = step;
    if (!p.decay) one.decay = A(0);
    h.device.adamw_step<T>(state[4 * i]->data(), state[4 * i + 1]->data(), state[4 * i + 2]->data(), state[4 * i + 3]->data(),
                           values[i]->data(), static_cast<index_t>(p.main.size()), one);
    a = download(h.device, *state[4 * i]);
    v = download(h.device, *values[i]);
    single_main.insert(single_main.end(), a.begin(), a.end());
    single_value.insert(single_value.end(), v.begin(), v.end());
  }
  h.results.record(same_bits(single_main, r1.first) && same_bits(single_value, r1.second),
                   label + ": the same bits as adamw_step per parameter (a float at a time)");
  h.results.record(same_bits(shifted_main, r1.first) && same_bits(shifted_value, r1.second),
                   label + ": tensors one element past an aligned start give the same bits");
}

// The backend's attention members forward to backend/cuda/attention.hpp on the compute stream: the
// same bits as calling it directly with plans of one's own (its accuracy is test_attention's job).
template <class T>
void test_attention_forwarding(harness& h) {
  using A = accumulate_t<T>;
  const index_t s = 37, b = 2, heads = 4, groups = 2, d = 16;
  const auto nq = static_cast<std::size_t>(s * b * heads * d), nk = static_cast<std::size_t>(s * b * groups * d);
  const auto nl = static_cast<std::size_t>(b * heads * s);
  auto rng = h.fresh();
  auto vq = rng.template uniform<T>(nq), vk = rng.template uniform<T>(nk), vv = rng.template uniform<T>(nk),
       vdo = rng.template uniform<T>(nq);
  const A scale = A(0.25);
  device_vector<T> q(nq), k(nk), v(nk), dout(nq), out(nq), dq(nq), dk(nk), dv(nk);
  device_vector<A> lse(nl);
  auto& dev = h.device;
  upload(dev, vq, q); upload(dev, vk, k); upload(dev, vv, v); upload(dev, vdo, dout);
  auto run = [&](bool through_backend) {
    nan_fill(dev, out); nan_fill(dev, lse); nan_fill(dev, dq); nan_fill(dev, dk); nan_fill(dev, dv);
    if (through_backend) {
      dev.attention_forward(q.data(), k.data(), v.data(), s, b, heads, groups, d, scale, out.data(), lse.data());
      dev.attention_backward(dout.data(), q.data(), k.data(), v.data(), out.data(), lse.data(), s, b, heads, groups, d,
                             scale, dq.data(), dk.data(), dv.data());
    } else {
      strata::cuda::attention_plans plans(dev.device());
      strata::cuda::attention_forward<T>(plans, dev.stream(), q.data(), k.data(), v.data(), s, b, heads, groups, d, scale,
                                         out.data(), lse.data());
      strata::cuda::attention_backward<T>(plans, dev.stream(), dout.data(), q.data(), k.data(), v.data(), out.data(),
                                          lse.data(), s, b, heads, groups, d, scale, dq.data(), dk.data(), dv.data());
      dev.synchronize();
    }
    return std::tuple{download(dev, out), download(dev, lse), download(dev, dq), download(dev, dk), download(dev, dv)};
  };
  auto direct = run(false), first = run(true), second = run(true);
  const std::string label = "attention (backend members)<" + type_name<T>() + "> s=37 b=2 heads=4 groups=2 d=16";
  compare(h, label, "out", std::get<0>(first), std::get<0>(second), std::get<0>(direct), 0.0);
  compare(h, label, "lse", std::get<1>(first), std::get<1>(second), std::get<1>(direct), 0.0);
  compare(h, label, "dq", std::get<2>(first), std::get<2>(second), std::get<2>(direct), 0.0);
  compare(h, label, "dk", std::get<3>(first), std::get<3>(second), std::get<3>(direct), 0.0);
  compare(h, label, "dv", std::get<4>(first), std::get<4>(second), std::get<4>(direct), 0.0);
}

// sum_of_squares_many, scale_by_many and fill_many on 140 tensors (two launches of at most 128):
// sizes around the 16 Ki-element partials and the 4096-element chunks, an empty one, one of 20 M
// elements (whose 1024 partials stride), every third starting one element into its allocation (no
// 16-byte path). The same bits as the one-tensor calls on the GPU, and the CPU twin's values.
template <class X>
void test_multi_tensor(harness& h) {
  const std::vector<index_t> sizes{1, 0, 7, 4096, 4097, 16384, 16385, 100003, 3, 20000000};
  std::vector<index_t> n;
  for (int i = 0; i < 140; ++i) n.push_back(i < 10 ? sizes[i] : 1 + (i * 37) % 900);
  auto rng = h.fresh();
  std::vector<std::vector<X>> host;
  std::vector<std::unique_ptr<device_vector<X>>> keep;
  std::vector<X*> data;
  for (std::size_t i = 0; i < n.size(); ++i) {
    host.push_back(rng.template uniform<X>(static_cast<std::size_t>(n[i])));
    const std::size_t offset = i % 3 == 2 ? 1 : 0;
    keep.push_back(std::make_unique<device_vector<X>>(static_cast<std::size_t>(n[i]) + offset + 1));
    data.push_back(keep.back()->data() + offset);
  }
  std::vector<strata::SquaresTensor<X>> read;
  std::vector<strata::TensorRef<X>> write;
  for (std::size_t i = 0; i < n.size(); ++i) read.push_back({data[i], n[i]}), write.push_back({data[i], n[i]});
  auto& dev = h.device;
  auto upload_all = [&] { for (std::size_t i = 0; i < n.size(); ++i) upload_at(dev, host[i], data[i]); };
  auto download_all = [&] {
    std::vector<X> out;
    for (std::size_t i = 0; i < n.size(); ++i) {
      auto part = download_at(dev, data[i], static_cast<std::size_t>(n[i]));
      out.insert(out.end(), part.begin(), part.end());
    }
    return out;
  };
  device_vector<double> acc(1), factor(1);
  const double start = 0.5, scale = 0.3125;
  upload(dev, std::vector<double>{scale}, factor);
  // One tensor at a time (the reference on the GPU), then the multi-tensor calls, twice.
  auto run = [&](bool many) {
    upload_all();
    upload(dev, std::vector<double>{start}, acc);
    if (many) {
      dev.sum_of_squares_many<X>(std::span<const strata::SquaresTensor<X>>(read), acc.data());
      dev.scale_by_many<X>(std::span<const strata::TensorRef<X>>(write), factor.data());
    } else {
      for (std::size_t i = 0; i < n.size(); ++i) dev.sum_of_squares(data[i], n[i], acc.data());
      for (std::size_t i = 0; i < n.size(); ++i) dev.scale_by(data[i], n[i], factor.data());
    }
    auto scaled = download_all();
    if (many) dev.fill_many<X>(std::span<const strata::TensorRef<X>>(write), -2.5);
    else for (std::size_t i = 0; i < n.size(); ++i) dev.fill(data[i], n[i], -2.5);
    return std::tuple{download(dev, acc), scaled, download_all()};
  };
  std::vector<double> ref_acc{start};
  std::vector<X> ref_scaled, ref_filled;
  for (auto v : host) {
    twin::sum_of_squares(v.data(), static_cast<index_t>(v.size()), ref_acc.data());
    twin::scale(v.data(), static_cast<index_t>(v.size()), scale);
    ref_scaled.insert(ref_scaled.end(), v.begin(), v.end());
    ref_filled.insert(ref_filled.end(), v.size(), X(-2.5));
  }
  auto one = run(false), m1 = run(true), m2 = run(true);
  const std::string label = "multi-tensor<" + type_name<X>() + "> 140 tensors";
  compare(h, label + " sum_of_squares_many", "accumulator", std::get<0>(m1), std::get<0>(m2), ref_acc, tolerance<double>() * 10);
  compare(h, label + " scale_by_many", "x", std::get<1>(m1), std::get<1>(m2), ref_scaled, tolerance<X>());
  compare(h, label + " fill_many", "x", std::get<2>(m1), std::get<2>(m2), ref_filled, 0.0);
  h.results.record(same_bits(std::get<0>(m1), std::get<0>(one)), label + " sum_of_squares_many: the same bits as sum_of_squares per tensor");
  h.results.record(same_bits(std::get<1>(m1), std::get<1>(one)), label + " scale_by_many: the same bits as scale_by per tensor");
  h.results.record(same_bits(std::get<2>(m1), std::get<2>(one)), label + " fill_many: the same bits as fill per tensor");
}

void test_clip_factor(harness& h) {
  for (const auto& [square_sum, max_norm] : std::vector<std::pair<double, double>>{{16.0, 1.0}, {0.25, 1.0}, {9.0, 0.0}, {0.0, 1.0}}) {
    std::vector<double> rnorm(1), rfactor(1);
    twin::clip_factor(&square_sum, max_norm, rnorm.data(), rfactor.data());
    device_vector<double> sq(1), norm(1), factor(1);
    auto run = [&] {
      upload(h.device, std::vector<double>{square_sum}, sq); nan_fill(h.device, norm); nan_fill(h.device, factor);
      h.device.clip_factor(sq.data(), max_norm, norm.data(), factor.data());
      return std::pair{download(h.device, norm), download(h.device, factor)};
    };
    auto r1 = run(), r2 = run();
    const std::string label = "clip_factor square_sum=" + format("%g", square_sum) + " max_norm=" + format("%g", max_norm);
    compare(h, label, "norm", r1.first, r2.first, rnorm, 1e-15);
    compare(h, label, "factor", r1.second, r2.second, rfactor, 1e-15);
  }
}

}  // namespace

int main(int argc, char** argv) {
  bool small = false, quiet = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--small") == 0) small = true;
    else if (std::strcmp(argv[i], "--quiet") == 0) quiet = true;
  }
  try {
    backend device(0);
    suite results(small ? "kernels (small)" : "kernels", !quiet);
    harness h{device, results};
    const std::vector<index_t> rows = small ? std::vector<index_t>{3, 33} : std::vector<index_t>{1, 3, 127, 1000};
    const std::vector<index_t> cols = small ? std::vector<index_t>{7, 65} : std::vector<index_t>{1, 7, 769};
    for (index_t r : rows)
      for (index_t c : cols) {
        test_elementwise<float>(h, r, c);
        test_elementwise<double>(h, r, c);
        test_elementwise<bf16>(h, r, c);
        test_rows<float>(h, r, c);
        test_rows<double>(h, r, c);
        test_rows<bf16>(h, r, c);
        test_transpose_int(h, r, c);
      }
    // The vector paths: cols a multiple of every 16-byte width (8 .. 16384; 1024 is the widest row a
    // warp holds, 1536 .. 16384 take teams of 2 to 16 warps per norm row, double's backward stops at
    // 8 warps, 20480 takes the block-per-row norms), 1030 not a multiple of 8 (bf16) or 4 (float);
    // row counts that are not multiples of the warps per block.
    const std::vector<index_t> vector_rows = small ? std::vector<index_t>{1, 37} : std::vector<index_t>{1, 5, 1001};
    const std::vector<index_t> vector_cols =
        small ? std::vector<index_t>{64, 1030, 2048}
              : std::vector<index_t>{8, 64, 768, 1024, 1030, 1536, 2048, 4096, 8192, 16384, 20480};
    for (index_t r : vector_rows)
      for (index_t c : vector_cols)
        for (index_t offset : {0, 1}) {
          test_vector_paths<float>(h, r, c, offset);
          test_vector_paths<double>(h, r, c, offset);
          test_vector_paths<bf16>(h, r, c, offset);
        }
    // The one-kernel column sums at GPT-2 350M's sizes (and a ragged last chunk and tile).
    for (const auto& [r, c] : small ? std::vector<std::pair<index_t, index_t>>{{1000, 264}}
                                    : std::vector<std::pair<index_t, index_t>>{{16384, 4096}, {16384, 1024}, {16001, 776}}) {
      test_bias_grad_large<bf16>(h, r, c);
      test_bias_grad_large<float>(h, r, c);
    }
    // The cross-entropy paths: widths below, at and far above one 16-byte vector per thread (50304:
    // GPT-2's padded vocabulary), used a multiple of no vector width, logits and dlogits aligned,
    // both misaligned alike, or misaligned differently.
    struct ce_shape { index_t rows, local, used; };
    const std::vector<ce_shape> ce_shapes = small ? std::vector<ce_shape>{{1, 1030, 1021}, {5, 64, 64}}
                                                  : std::vector<ce_shape>{{1, 8, 8}, {1, 1030, 1021}, {5, 64, 64}, {33, 769, 700},
                                                                          {301, 2048, 2043}, {3, 50304, 50257}};
    for (const auto& shape : ce_shapes)
      for (const auto& [logits_offset, dlogits_offset] : std::vector<std::pair<index_t, index_t>>{{0, 0}, {1, 1}, {3, 3}, {1, 0}})
        for (const double label_smoothing : {0.0, 0.1}) {
          test_cross_entropy_paths<float>(h, shape.rows, shape.local, shape.used, logits_offset, dlogits_offset, label_smoothing);
          test_cross_entropy_paths<double>(h, shape.rows, shape.local, shape.used, logits_offset, dlogits_offset, label_smoothing);
          test_cross_entropy_paths<bf16>(h, shape.rows, shape.local, shape.used, logits_offset, dlogits_offset, label_smoothing);
        }
    // The fused forward-backward (tp = 1): the same widths, and more rows than its grid has blocks.
    std::vector<ce_shape> fused_shapes = ce_shapes;
    if (!small) fused_shapes.insert(fused_shapes.end(), {{1001, 2048, 2043}, {400, 50304, 50257}});
    for (const auto& shape : fused_shapes)
      for (const index_t offset : {0, 1, 3})
        for (const double label_smoothing : {0.0, 0.1}) {
          test_cross_entropy_fused<float>(h, shape.rows, shape.local, shape.used, offset, label_smoothing);
          test_cross_entropy_fused<double>(h, shape.rows, shape.local, shape.used, offset, label_smoothing);
          test_cross_entropy_fused<bf16>(h, shape.rows, shape.local, shape.used, offset, label_smoothing);
        }
    for (index_t n : small ? std::vector<index_t>{1, 77} : std::vector<index_t>{1, 77, 100003}) {
      test_convert<float, bf16>(h, n);
      test_convert<bf16, float>(h, n);
      test_convert<double, float>(h, n);
      test_convert<float, double>(h, n);
      test_convert<double, bf16>(h, n);
    }
    test_clip_factor(h);
    test_multi_tensor<float>(h);
    test_multi_tensor<double>(h);
    test_adamw_many<float>(h);
    test_adamw_many<double>(h);
    test_adamw_many<bf16>(h);
    test_attention_forwarding<float>(h);
    test_attention_forwarding<bf16>(h);
    device.synchronize();
    return results.finish();
  } catch (const std::exception& e) {
    std::printf("FAIL kernels: exception: %s\nSUITE kernels: aborted\n", e.what());
    return 2;
  }
}
