// examples/tools/plan/calibration.hpp: what strata-plan knows of a machine, as numbers measured on
// it (docs/PLANNING.md). A calibration file is JSON (read with core/json.hpp):
//
//   {
//     "format": "strata-plan-calibration", "version": 1,
//     "name": "one H100 SXM node", "source": "where each figure comes from",
//     "peak_tflops": 989,                  // dense bf16 peak, for MFU only
//     "gemm_tflops": [ {"m": 8192, "n": 12288, "k": 4096, "tflops": 679}, ... ],
//     "fp8_gemm_tflops": [ {"m": 8192, "n": 16384, "k": 3072, "tflops": 1407}, ... ],  // optional: FP8 GEMMs (up to twice peak_tflops)
//     "attention_tflops": 192,             // causal attention, forward + backward FLOPs (backward = 2.5 forward) over time
//     "attention_tflops_by_length": [ {"seq": 4096, "head_dim": 128, "backward": "deterministic", "tflops": 310}, ... ],
//                                          // optional: the same by sequence length (head size, backward)
//     "elementwise_gbps": 2400,            // memory-bound kernels (norms, residual adds, bias, activations), bytes moved / s
//     "optimizer_gbps": 2900,              // the AdamW update, 32 bytes touched per parameter of the shard
//     "links": {"nvlink": {"bus_gbps": 160, "latency_us": 15},
//               "infiniband": {"bus_gbps": 40, "latency_us": 25}},
//     "step_overhead_ms": 2,               // per step, whatever the layout: host work, the gradient norm, launches
//     "moe_host_ms_per_layer": 2,          // per MoE layer and micro-batch where the dispatcher reads token counts on the host (ep x etp > 1, counted exchange)
//     "runtime_reserve_gib": 1.5           // per GPU beyond the estimate: CUDA context, workspaces, allocator slack
//   }
//
// Bus bandwidth is nccl-tests' busbw: a ring all-gather or reduce-scatter of S bytes over n ranks
// takes (n - 1) / n x S / busbw + latency, an all-reduce twice the bytes. A GEMM's throughput is that
// of the measured shape nearest to it (distance in log m, log n, log k); the planner prices a linear
// layer's three GEMMs (forward, input and weight gradients) at the rate of its forward's shape
// m = tokens, n = outputs, k = inputs, which is what `strata-plan --calibrate` measures under that key
// (calibrate_cuda.hpp: the three GEMMs' FLOPs over their summed time). Attention's throughput at a
// sequence length is interpolated linearly in log(length) between the measured lengths of
// `attention_tflops_by_length` (ascending within each head size; flat beyond its ends), or is
// `attention_tflops` without that table. An entry's optional "head_dim" is the head size it was
// measured at: a model's attention takes the entries of the measured head size nearest to its own
// (in log; entries without one serve every head size where none has one). An entry's optional
// "backward" ("deterministic" or "atomic") is the cuDNN backward it timed: a run with
// --deterministic-attention (the trainers' default) takes that head size's deterministic entries,
// one with --no-deterministic-attention its atomic ones; entries without the key serve either, and
// where a head size has none of the kind asked for, its entries of the other kind serve. An FP8 GEMM's is that of
// the nearest `fp8_gemm_tflops` shape, or the bf16 one's without that table (Hopper's dense FP8 peak
// is twice its bf16 peak, the bound of those entries). Every other field is required; a missing,
// unknown, mistyped or non-positive field is an error naming the file and the field.
#pragma once

#include <cmath>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <strata/core/error.hpp>
#include <strata/core/json.hpp>

namespace plan {

struct GemmPoint {
  std::int64_t m = 0, n = 0, k = 0;
  double tflops = 0;
};

// Which cuDNN attention backward an attention entry timed.
enum class AttentionBackward { any, deterministic, atomic };
inline const char* attention_backward_name(AttentionBackward b) {
  return b == AttentionBackward::deterministic ? "deterministic" : b == AttentionBackward::atomic ? "atomic" : "any";
}

struct AttentionPoint {
  std::int64_t seq = 0;
  double tflops = 0;
  std::int64_t head_dim = 0;                             // the head size measured at; 0: any
  AttentionBackward backward = AttentionBackward::any;  // the backward measured; any: not said
};

struct Link {
  double bus_gbps = 0;    // GB/s (1e9 bytes), nccl-tests' busbw
  double latency_us = 0;  // per collective or transfer
  // Seconds for `bytes` moved `passes` times (n - 1) / n over `ranks` ranks (one collective).
  double seconds(double bytes, int ranks, double passes = 1.0) const {
    if (ranks <= 1) return 0;
    return passes * bytes * (ranks - 1) / ranks / (bus_gbps * 1e9) + latency_us * 1e-6;
  }
};

struct Calibration {
  std::string name, source;
  double peak_tflops = 989;
  std::vector<GemmPoint> gemm;
  std::vector<GemmPoint> fp8_gemm;  // optional
  double attention_tflops = 0;
  std::vector<AttentionPoint> attention_by_length;  // ascending seq; optional
  double elementwise_gbps = 0;
  double optimizer_gbps = 0;
  Link nvlink, infiniband;
  double step_overhead_ms = 0;
  double moe_host_ms_per_layer = 0;
  double runtime_reserve_gib = 0;

  // TFLOP/s of causal attention over sequences of `seq` tokens with heads of `head_dim` (0: the
  // table's first head size), under the deterministic backward or the atomic one (see the top).
  double attention_tflops_at(double seq, double head_dim = 0, bool deterministic = true) const {
    if (attention_by_length.empty()) return attention_tflops;
    std::int64_t size = attention_by_length.front().head_dim;  // the head size whose entries serve
    double best = 1e300;
    for (const AttentionPoint& p : attention_by_length)
      if (head_dim > 0 && p.head_dim > 0 && std::abs(std::log(head_dim / p.head_dim)) < best - 1e-12)
        best = std::abs(std::log(head_dim / p.head_dim)), size = p.head_dim;
    // That size's entries of the backward asked for (with those that name none), else of the other.
    const AttentionBackward wanted = deterministic ? AttentionBackward::deterministic : AttentionBackward::atomic;
    std::vector<AttentionPoint> points;
    for (const AttentionPoint& p : attention_by_length)
      if (p.head_dim == size && (p.backward == wanted || p.backward == AttentionBackward::any)) points.push_back(p);
    if (points.empty())
      for (const AttentionPoint& p : attention_by_length)
        if (p.head_dim == size) points.push_back(p);
    if (seq <= points.front().seq) return points.front().tflops;
    if (seq >= points.back().seq) return points.back().tflops;
    std::size_t i = 1;
    while (points[i].seq < seq) ++i;
    const AttentionPoint &a = points[i - 1], &b = points[i];
    const double f = std::log(seq / a.seq) / std::log(static_cast<double>(b.seq) / a.seq);
    return a.tflops + f * (b.tflops - a.tflops);
  }

  // TFLOP/s of the measured GEMM shape nearest to m x n x k.
  double gemm_tflops(double m, double n, double k) const { return nearest(gemm, m, n, k); }
  // The same of an FP8 GEMM: the nearest FP8 shape, or the bf16 one's without an FP8 table.
  double fp8_gemm_tflops(double m, double n, double k) const {
    return fp8_gemm.empty() ? gemm_tflops(m, n, k) : nearest(fp8_gemm, m, n, k);
  }

 private:
  static double nearest(const std::vector<GemmPoint>& points, double m, double n, double k) {
    double best = 0, best_distance = 1e300;
    for (const GemmPoint& p : points) {
      const double dm = std::log(m / p.m), dn = std::log(n / p.n), dk = std::log(k / p.k);
      const double distance = dm * dm + dn * dn + dk * dk;
      if (distance < best_distance) best_distance = distance, best = p.tflops;
    }
    return best;
  }
};

namespace detail {

[[noreturn]] inline void calibration_error(const std::string& file, const std::string& what) {
  strata::fail<strata::ConfigError>("calibration file ", file, ": ", what,
                                    " (docs/PLANNING.md describes the format; bench/calibration/h100_node.json is an example)");
}

// `where` is a view: a std::string parameter bound to a temporary ("") made GCC 13 warn that the
// returned reference might dangle (-Wdangling-reference), though it refers into `object`.
inline const strata::json::Value& member(const strata::json::Value& object, std::string_view key, const std::string& file,
                                         std::string_view where) {
  const strata::json::Value* v = object.find(key);
  if (!v) calibration_error(file, "the field \"" + std::string(where) + std::string(key) + "\" is missing");
  return *v;
}

inline double positive(const strata::json::Value& object, std::string_view key, const std::string& file,
                       const std::string& where = "", bool zero_allowed = false) {
  const strata::json::Value& v = member(object, key, file, where);
  double x = 0;
  if (!v.to_double(x))
    calibration_error(file, "the field \"" + where + std::string(key) + "\" is " + std::string(strata::json::Value::kind_name(v.kind())) +
                                ", not a number");
  if (!std::isfinite(x) || x < 0 || (!zero_allowed && x == 0))
    calibration_error(file, "the field \"" + where + std::string(key) + "\" is " + v.text() +
                                (zero_allowed ? "; it must be a finite number >= 0" : "; it must be a finite number > 0"));
  return x;
}

inline std::string text(const strata::json::Value& object, std::string_view key, const std::string& file) {
  const strata::json::Value& v = member(object, key, file, "");
  if (!v.is_string())
    calibration_error(file, "the field \"" + std::string(key) + "\" is " + std::string(strata::json::Value::kind_name(v.kind())) +
                                ", not a string");
  return v.text();
}

inline void only_known(const strata::json::Value& object, std::initializer_list<std::string_view> known, const std::string& file,
                       const std::string& where) {
  for (const auto& [name, value] : object.members()) {
    bool found = false;
    for (std::string_view k : known) found = found || name == k;
    if (!found) calibration_error(file, "unknown field \"" + where + name + "\" (a typo? the known ones are listed in docs/PLANNING.md)");
  }
}

// Calls each(item, where) for every item of the array `key` of `root`, which must be a non-empty
// array of objects (`shape` names their fields in the error) whose fields are among `known`;
// `where` is "key[i]." for the item's errors.
template <class Each>
void for_each_object(const strata::json::Value& root, std::string_view key, std::initializer_list<std::string_view> known,
                     const char* shape, const std::string& file, Each&& each) {
  const strata::json::Value& items = member(root, key, file, "");
  if (!items.is_array() || items.items().empty())
    calibration_error(file, "\"" + std::string(key) + "\" must be a non-empty array of " + shape + " objects");
  for (std::size_t i = 0; i < items.items().size(); ++i) {
    const strata::json::Value& item = items.items()[i];
    const std::string at = std::string(key) + "[" + std::to_string(i) + "]";
    if (!item.is_object()) calibration_error(file, "\"" + at + "\" is not an object");
    only_known(item, known, file, at + ".");
    each(item, at + ".");
  }
}

// The field "tflops" of `object`: positive and at most `peak` (peak_tflops).
inline double tflops_within_peak(const strata::json::Value& object, const std::string& where, double peak, const std::string& file) {
  const double tflops = positive(object, "tflops", file, where);
  if (tflops > peak)
    calibration_error(file, "\"" + where + "tflops\" (" + std::to_string(tflops) + ") is above \"peak_tflops\" (" +
                                std::to_string(peak) + ")");
  return tflops;
}

}  // namespace detail

inline constexpr std::string_view kCalibrationFormat = "strata-plan-calibration";

// Parses and checks a calibration document; `file` names it in errors.
inline Calibration parse_calibration(std::string_view document, const std::string& file) {
  using detail::calibration_error;
  strata::json::Value root;
  try {
    root = strata::json::parse(document, file);
  } catch (const std::exception& e) {
    calibration_error(file, std::string("not valid JSON: ") + e.what());
  }
  if (!root.is_object()) calibration_error(file, "the document is " + std::string(strata::json::Value::kind_name(root.kind())) + ", not an object");
  detail::only_known(root,
                     {"format", "version", "name", "source", "peak_tflops", "gemm_tflops", "fp8_gemm_tflops", "attention_tflops",
                      "attention_tflops_by_length", "elementwise_gbps",
                      "optimizer_gbps", "links", "step_overhead_ms", "moe_host_ms_per_layer", "runtime_reserve_gib"},
                     file, "");
  if (detail::text(root, "format", file) != kCalibrationFormat)
    calibration_error(file, "\"format\" is \"" + detail::text(root, "format", file) + "\", not \"" + std::string(kCalibrationFormat) + "\"");
  std::int64_t version = 0;
  if (!detail::member(root, "version", file, "").to_int64(version) || version != 1)
    calibration_error(file, "\"version\" must be 1 (the only version this strata-plan reads)");
  Calibration c;
  c.name = detail::text(root, "name", file);
  c.source = detail::text(root, "source", file);
  c.peak_tflops = detail::positive(root, "peak_tflops", file);
  const auto gemm_points = [&](std::string_view key, double peak, std::vector<GemmPoint>& into) {
    detail::for_each_object(root, key, {"m", "n", "k", "tflops", "source"}, "{\"m\", \"n\", \"k\", \"tflops\"}", file,
                            [&](const strata::json::Value& p, const std::string& where) {
                              GemmPoint g;
                              g.m = static_cast<std::int64_t>(detail::positive(p, "m", file, where));
                              g.n = static_cast<std::int64_t>(detail::positive(p, "n", file, where));
                              g.k = static_cast<std::int64_t>(detail::positive(p, "k", file, where));
                              g.tflops = detail::tflops_within_peak(p, where, peak, file);
                              into.push_back(g);
                            });
  };
  gemm_points("gemm_tflops", c.peak_tflops, c.gemm);
  if (root.find("fp8_gemm_tflops")) gemm_points("fp8_gemm_tflops", 2 * c.peak_tflops, c.fp8_gemm);
  c.attention_tflops = detail::positive(root, "attention_tflops", file);
  if (root.find("attention_tflops_by_length"))
    detail::for_each_object(root, "attention_tflops_by_length", {"seq", "head_dim", "backward", "tflops", "source"},
                            "{\"seq\", \"tflops\"}",
                            file, [&](const strata::json::Value& p, const std::string& where) {
                              AttentionPoint a;
                              a.seq = static_cast<std::int64_t>(detail::positive(p, "seq", file, where));
                              a.tflops = detail::tflops_within_peak(p, where, c.peak_tflops, file);
                              if (p.find("head_dim")) a.head_dim = static_cast<std::int64_t>(detail::positive(p, "head_dim", file, where));
                              if (const strata::json::Value* b = p.find("backward")) {
                                const std::string kind = b->is_string() ? b->text() : std::string();
                                if (kind == "deterministic") a.backward = AttentionBackward::deterministic;
                                else if (kind == "atomic") a.backward = AttentionBackward::atomic;
                                else
                                  detail::calibration_error(
                                      file, "\"" + where + "backward\" must be \"deterministic\" or \"atomic\" (the cuDNN backward "
                                                "the entry timed), not " +
                                                (b->is_string() ? "\"" + kind + "\"" : std::string(strata::json::Value::kind_name(b->kind()))));
                              }
                              for (auto before = c.attention_by_length.rbegin(); before != c.attention_by_length.rend(); ++before)
                                if (before->head_dim == a.head_dim && before->backward == a.backward) {
                                  if (a.seq <= before->seq)
                                    detail::calibration_error(file, "\"" + where + "seq\" (" + std::to_string(a.seq) +
                                                                        ") must be larger than the one before it: the lengths "
                                                                        "go in ascending order (within each head_dim and backward)");
                                  break;
                                }
                              c.attention_by_length.push_back(a);
                            });
  c.elementwise_gbps = detail::positive(root, "elementwise_gbps", file);
  c.optimizer_gbps = detail::positive(root, "optimizer_gbps", file);
  const strata::json::Value& links = detail::member(root, "links", file, "");
  if (!links.is_object()) calibration_error(file, "\"links\" must be an object with \"nvlink\" and \"infiniband\"");
  detail::only_known(links, {"nvlink", "infiniband"}, file, "links.");
  for (auto [key, link] : {std::pair{"nvlink", &c.nvlink}, std::pair{"infiniband", &c.infiniband}}) {
    const strata::json::Value& l = detail::member(links, key, file, "links.");
    const std::string where = std::string("links.") + key + ".";
    if (!l.is_object()) calibration_error(file, "\"links." + std::string(key) + "\" must be an object with \"bus_gbps\" and \"latency_us\"");
    detail::only_known(l, {"bus_gbps", "latency_us", "source"}, file, where);
    link->bus_gbps = detail::positive(l, "bus_gbps", file, where);
    link->latency_us = detail::positive(l, "latency_us", file, where, true);
  }
  c.step_overhead_ms = detail::positive(root, "step_overhead_ms", file, "", true);
  c.moe_host_ms_per_layer = detail::positive(root, "moe_host_ms_per_layer", file, "", true);
  c.runtime_reserve_gib = detail::positive(root, "runtime_reserve_gib", file, "", true);
  return c;
}

inline Calibration load_calibration(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) strata::fail<strata::ConfigError>("calibration file ", path, ": cannot be opened (does it exist? pass --calibration FILE, "
                                             "e.g. bench/calibration/h100_node.json, or write one with --calibrate)");
  std::stringstream text;
  text << in.rdbuf();
  return parse_calibration(text.str(), path);
}

// The calibration as a document parse_calibration reads back.
inline std::string calibration_json(const Calibration& c) {
  using strata::json::number;
  using strata::json::quote;
  const auto gemm_points = [&](const char* key, const std::vector<GemmPoint>& points) {
    std::string text = std::string("  \"") + key + "\": [\n";
    for (std::size_t i = 0; i < points.size(); ++i) {
      const GemmPoint& g = points[i];
      text += "    {\"m\": " + number(g.m) + ", \"n\": " + number(g.n) + ", \"k\": " + number(g.k) + ", \"tflops\": " +
              number(g.tflops) + "}" + (i + 1 < points.size() ? ",\n" : "\n");
    }
    return text + "  ],\n";
  };
  std::string out = "{\n  \"format\": " + quote(kCalibrationFormat) + ",\n  \"version\": 1,\n  \"name\": " + quote(c.name) +
                    ",\n  \"source\": " + quote(c.source) + ",\n  \"peak_tflops\": " + number(c.peak_tflops) + ",\n";
  out += gemm_points("gemm_tflops", c.gemm);
  if (!c.fp8_gemm.empty()) out += gemm_points("fp8_gemm_tflops", c.fp8_gemm);
  out += "  \"attention_tflops\": " + number(c.attention_tflops) + ",\n";
  if (!c.attention_by_length.empty()) {
    out += "  \"attention_tflops_by_length\": [\n";
    for (std::size_t i = 0; i < c.attention_by_length.size(); ++i)
      out += "    {\"seq\": " + number(c.attention_by_length[i].seq) +
             (c.attention_by_length[i].head_dim > 0 ? ", \"head_dim\": " + number(c.attention_by_length[i].head_dim) : std::string()) +
             (c.attention_by_length[i].backward != AttentionBackward::any
                  ? std::string(", \"backward\": \"") + attention_backward_name(c.attention_by_length[i].backward) + "\""
                  : std::string()) +
             ", \"tflops\": " + number(c.attention_by_length[i].tflops) + "}" + (i + 1 < c.attention_by_length.size() ? ",\n" : "\n");
    out += "  ],\n";
  }
  out += "  \"elementwise_gbps\": " + number(c.elementwise_gbps) +
         ",\n  \"optimizer_gbps\": " + number(c.optimizer_gbps) + ",\n  \"links\": {\n    \"nvlink\": {\"bus_gbps\": " +
         number(c.nvlink.bus_gbps) + ", \"latency_us\": " + number(c.nvlink.latency_us) + "},\n    \"infiniband\": {\"bus_gbps\": " +
         number(c.infiniband.bus_gbps) + ", \"latency_us\": " + number(c.infiniband.latency_us) + "}\n  },\n  \"step_overhead_ms\": " +
         number(c.step_overhead_ms) + ",\n  \"moe_host_ms_per_layer\": " + number(c.moe_host_ms_per_layer) +
         ",\n  \"runtime_reserve_gib\": " + number(c.runtime_reserve_gib) + "\n}\n";
  return out;
}

}  // namespace plan
