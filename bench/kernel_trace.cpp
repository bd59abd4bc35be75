// bench/kernel_trace.cpp: a per-kernel time table of any CUDA program, through CUPTI's activity API.
//
// Built as a shared library (libstrata_kernel_trace.so) that CUDA loads into the program when
//   CUDA_INJECTION64_PATH=/path/to/libstrata_kernel_trace.so
// is set; nothing in the program changes. It records every kernel, memcpy and memset with its GPU
// start and end time, and at exit writes a table to STRATA_TRACE_OUT (default: stderr):
//   - per kernel name: calls, total time, time per step, share of the GPU's busy time;
//   - per category (GEMM, attention, NCCL, copies, norm, ..., by name);
//   - the window's wall time against the GPU's busy time (the union of the intervals), so the gaps
//     where the GPU waits for the host show.
// Window: when the program calls cudaProfilerStart / cudaProfilerStop (the trainers do with
// --profile, from --profile-step-start to --profile-step-end), only what starts between them
// counts; otherwise everything. STRATA_TRACE_STEPS=<n> divides the totals by n steps (the
// trainers' window covers profile-step-end - profile-step-start steps; they set it themselves).
//
// Times are the GPU's own timestamps; kernels on several streams may overlap, so the per-name sums
// can add up to more than the busy time (the overlap is reported).
//
// STRATA_TRACE_HOST=1 also records the host's CUDA runtime calls (CUPTI's runtime activity, in the
// same clock) and adds two tables: the host time per runtime function per step (the blocking ones,
// cudaStreamSynchronize and the copies to or from pageable memory, show there), and, for every gap
// of the busiest device, whether the host launched the next kernel only after the GPU had gone idle
// (a host-bound gap: the GPU waited for the host) or before (the GPU's own latency), with the
// runtime calls that ran on the host during the host-bound gaps. It costs some host time per call.
#include <cupti.h>

#include <cxxabi.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace {

struct Interval {
  std::uint64_t start, end;
  std::uint32_t device;
  std::string name;  // kernel name, or "[memcpy HtoD]" etc.
  std::uint64_t bytes;
  std::uint32_t correlation;  // matches the runtime call that enqueued it
  std::uint32_t stream;
};

// One host runtime call (STRATA_TRACE_HOST=1).
struct ApiCall {
  std::uint64_t start, end;
  std::uint32_t callback, thread, correlation;
};

std::mutex g_mutex;
std::vector<Interval> g_intervals;
std::vector<ApiCall> g_api;
std::vector<std::pair<std::uint64_t, std::uint64_t>> g_windows;  // [start, stop) of each profiler window
std::uint64_t g_window_open = 0;
bool g_window_seen = false;
std::atomic<bool> g_done{false};

constexpr std::size_t kBufferBytes = 8u << 20;

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = kBufferBytes;
  *max_records = 0;
}

const char* copy_kind(std::uint8_t kind) {
  switch (kind) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD: return "[memcpy HtoD]";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH: return "[memcpy DtoH]";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD: return "[memcpy DtoD]";
    case CUPTI_ACTIVITY_MEMCPY_KIND_PTOP: return "[memcpy PtoP]";
    default: return "[memcpy other]";
  }
}

std::string demangle(const char* name) {
  if (name == nullptr) return "?";
  int status = 0;
  char* plain = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string out = status == 0 && plain ? plain : name;
  std::free(plain);
  return out;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* record = nullptr;
  std::vector<Interval> batch;
  std::vector<ApiCall> calls;
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    switch (record->kind) {
      case CUPTI_ACTIVITY_KIND_KERNEL:
      case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
        const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
        batch.push_back({k->start, k->end, k->deviceId, demangle(k->name), 0, k->correlationId, k->streamId});
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY: {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
        batch.push_back({m->start, m->end, m->deviceId, copy_kind(m->copyKind), m->bytes, m->correlationId, m->streamId});
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMSET: {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(record);
        batch.push_back({m->start, m->end, m->deviceId, "[memset]", m->bytes, m->correlationId, m->streamId});
        break;
      }
      case CUPTI_ACTIVITY_KIND_RUNTIME: {
        const auto* a = reinterpret_cast<const CUpti_ActivityAPI*>(record);
        calls.push_back({a->start, a->end, a->cbid, a->threadId, a->correlationId});
        break;
      }
      default: break;
    }
  }
  std::free(buffer);
  std::lock_guard lock(g_mutex);
  for (auto& i : batch) g_intervals.push_back(std::move(i));
  g_api.insert(g_api.end(), calls.begin(), calls.end());
}

void CUPTIAPI on_api(void*, CUpti_CallbackDomain domain, CUpti_CallbackId id, const void* data) {
  if (domain != CUPTI_CB_DOMAIN_RUNTIME_API) return;
  const auto* info = static_cast<const CUpti_CallbackData*>(data);
  std::uint64_t now = 0;
  if (id == CUPTI_RUNTIME_TRACE_CBID_cudaProfilerStart_v4000 && info->callbackSite == CUPTI_API_EXIT) {
    cuptiGetTimestamp(&now);
    std::lock_guard lock(g_mutex);
    g_window_open = now;
    g_window_seen = true;
  } else if (id == CUPTI_RUNTIME_TRACE_CBID_cudaProfilerStop_v4000 && info->callbackSite == CUPTI_API_ENTER) {
    cuptiGetTimestamp(&now);
    {
      std::lock_guard lock(g_mutex);
      if (g_window_open != 0) g_windows.emplace_back(g_window_open, now);
      g_window_open = 0;
    }
    cuptiActivityFlushAll(1);  // the records are safe even if the runtime is torn down before exit
  }
}

// Whether a record that starts at `start` counts: inside a profiler window, or anywhere without one
// (called with g_mutex held, once the windows are closed).
bool starts_in_window(std::uint64_t start) {
  if (!g_window_seen) return true;
  for (const auto& [s, e] : g_windows)
    if (start >= s && start < e) return true;
  return false;
}

// Category of a kernel by its name (lower-case substrings).
std::string category(const std::string& name) {
  std::string n = name;
  std::transform(n.begin(), n.end(), n.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  auto has = [&](const char* s) { return n.find(s) != std::string::npos; };
  if (n.rfind("[memcpy", 0) == 0 || n.rfind("[memset", 0) == 0) return "copies and memsets";
  if (has("nccl")) return "NCCL collectives";
  if (has("sdpa") || has("flash") || has("fmha") || has("attention") || has("cudnn")) return "attention";
  if (has("gemm") || has("nvjet") || has("xmma") || has("cutlass") || has("cublas") || has("matmul") || has("sm90_"))
    return "GEMM";
  if (has("cross_entropy") || has("softmax") || has("logit") || has("classifier")) return "softmax / cross-entropy";
  if (has("norm")) return "norms";
  if (has("adam") || has("optimizer") || has("sum_of_squares") || has("grad_norm") || has("multi_tensor")) return "optimizer";
  if (has("embedding") || has("gather") || has("scatter") || has("sort")) return "embedding";
  if (has("gelu") || has("swiglu") || has("silu") || has("activation")) return "activations";
  return "other";
}

// Busy time: the length of the union of intervals of one device.
std::uint64_t union_length(std::vector<std::pair<std::uint64_t, std::uint64_t>> spans) {
  std::sort(spans.begin(), spans.end());
  std::uint64_t total = 0, cur_start = 0, cur_end = 0;
  bool open = false;
  for (const auto& [s, e] : spans) {
    if (!open || s > cur_end) {
      if (open) total += cur_end - cur_start;
      cur_start = s;
      cur_end = e;
      open = true;
    } else {
      cur_end = std::max(cur_end, e);
    }
  }
  if (open) total += cur_end - cur_start;
  return total;
}

// Where the GPU waits: on the busiest device, every gap of at least 2 us between the end of the busy
// span so far and the next kernel's start, summed per (kernel before, kernel after) pair, the
// largest first; and how much of the wall time lies before the window's first kernel or after its
// last one (the window's edges, not gaps inside the step).
// The window's intervals of the device with the most of them, by start time (empty: none), and that device.
template <class InWindow>
std::pair<std::uint32_t, std::vector<const Interval*>> busiest_device(InWindow&& in_window) {
  std::map<std::uint32_t, std::vector<const Interval*>> by_device;
  for (const auto& i : g_intervals)
    if (in_window(i)) by_device[i.device].push_back(&i);
  if (by_device.empty()) return {0, {}};
  auto busiest = by_device.begin();
  for (auto it = by_device.begin(); it != by_device.end(); ++it)
    if (it->second.size() > busiest->second.size()) busiest = it;
  auto& list = busiest->second;
  std::sort(list.begin(), list.end(), [](const Interval* a, const Interval* b) { return a->start < b->start; });
  return {busiest->first, std::move(list)};
}

template <class InWindow>
void report_gaps(std::FILE* out, double steps, InWindow&& in_window) {
  const auto [device, list] = busiest_device(in_window);
  if (list.empty()) return;
  auto short_name = [](const std::string& n) { return n.size() > 60 ? n.substr(0, 57) + "..." : n; };
  std::map<std::pair<std::string, std::string>, std::pair<std::uint64_t, std::uint64_t>> pairs;  // -> (count, ns)
  std::uint64_t inside = 0, count = 0, end = list.front()->end;
  const Interval* before = list.front();
  for (std::size_t k = 1; k < list.size(); ++k) {
    const Interval* i = list[k];
    if (i->start > end + 2000) {
      auto& slot = pairs[{short_name(before->name), short_name(i->name)}];
      slot.first += 1;
      slot.second += i->start - end;
      inside += i->start - end;
      ++count;
    }
    if (i->end > end) {
      end = i->end;
      before = i;
    }
  }
  std::uint64_t edges = 0;
  for (const auto& [s, e] : g_windows) {
    std::uint64_t lo = UINT64_MAX, hi = 0;
    for (const Interval* i : list)
      if (i->start >= s && i->start < e) lo = std::min(lo, i->start), hi = std::max(hi, i->end);
    if (lo != UINT64_MAX) edges += (lo > s ? lo - s : 0) + (e > hi ? e - hi : 0);
  }
  std::fprintf(out, "\n## Gaps on device %u: %.3f ms per step in %.1f gaps of >= 2 us between kernels; window edges "
                    "(before the first kernel, after the last) %.3f ms per step\n\n",
               device, inside / steps / 1e6, count / steps, edges / steps / 1e6);
  std::fprintf(out, "| kernel before | kernel after | gaps per step | ms per step |\n| --- | --- | ---: | ---: |\n");
  std::vector<std::pair<std::uint64_t, std::pair<std::string, std::string>>> sorted;
  for (const auto& [names, v] : pairs) sorted.emplace_back(v.second, names);
  std::sort(sorted.rbegin(), sorted.rend());
  for (std::size_t k = 0; k < sorted.size() && k < 15; ++k) {
    const auto& [ns, names] = sorted[k];
    std::string a = names.first, b = names.second;
    for (char& c : a) if (c == '|') c = '/';
    for (char& c : b) if (c == '|') c = '/';
    std::fprintf(out, "| %s | %s | %.1f | %.3f |\n", a.c_str(), b.c_str(), pairs[names].first / steps, ns / steps / 1e6);
  }
}

// Communication against computation, per device: the NCCL kernels' busy time, and how much of it
// ran while a non-NCCL kernel ran too (on another stream): the overlap a tensor- or data-parallel
// step gets. Copies on a stream that also ran NCCL kernels in the window (a communication stream:
// NCCL's copy-engine collectives are copies, not kernels) count as communication too, in their own
// columns. Printed only when NCCL kernels ran in the window.
template <class InWindow>
void report_overlap(std::FILE* out, double steps, InWindow&& in_window) {
  using Spans = std::vector<std::pair<std::uint64_t, std::uint64_t>>;
  std::map<std::uint32_t, Spans> comm, copies, compute;
  std::set<std::pair<std::uint32_t, std::uint32_t>> comm_streams;  // (device, stream)
  for (const auto& i : g_intervals)
    if (in_window(i) && category(i.name) == "NCCL collectives") comm_streams.emplace(i.device, i.stream);
  for (const auto& i : g_intervals) {
    if (!in_window(i)) continue;
    if (i.name.rfind("[mem", 0) == 0) {
      if (i.name.rfind("[memcpy", 0) == 0 && comm_streams.count({i.device, i.stream}))
        copies[i.device].emplace_back(i.start, i.end);
      continue;
    }
    (category(i.name) == "NCCL collectives" ? comm : compute)[i.device].emplace_back(i.start, i.end);
  }
  if (comm.empty()) return;
  // |A and B| = |A| + |B| - |A or B|
  const auto under = [](const Spans& a, const Spans& b) {
    Spans both = a;
    both.insert(both.end(), b.begin(), b.end());
    const std::uint64_t x = union_length(a), y = union_length(b), either = union_length(both);
    return x + y > either ? x + y - either : 0;
  };
  std::fprintf(out, "\n## Communication overlap\n\n| device | NCCL busy ms per step | of it under compute kernels | "
                    "share overlapped | copies on communication streams, ms per step | of them under compute kernels | "
                    "share overlapped |\n| ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  for (auto& [device, c] : comm) {
    const Spans& k = compute[device];
    const Spans& m = copies[device];
    const std::uint64_t nccl = union_length(c), overlapped = under(c, k);
    const std::uint64_t copied = union_length(m), copied_beside = under(m, k);
    std::fprintf(out, "| %u | %.3f | %.3f | %.1f%% | %.3f | %.3f | %.1f%% |\n", device, nccl / steps / 1e6,
                 overlapped / steps / 1e6, nccl ? 100.0 * overlapped / nccl : 0.0, copied / steps / 1e6,
                 copied_beside / steps / 1e6, copied ? 100.0 * copied_beside / copied : 0.0);
  }
}

std::string api_name(std::uint32_t callback) {
  const char* name = nullptr;
  if (cuptiGetCallbackName(CUPTI_CB_DOMAIN_RUNTIME_API, callback, &name) != CUPTI_SUCCESS || name == nullptr)
    return "runtime call " + std::to_string(callback);
  std::string n = name;
  if (const auto v = n.find("_v"); v != std::string::npos) n.resize(v);  // cudaLaunchKernel_v7000 -> cudaLaunchKernel
  return n;
}

// STRATA_TRACE_HOST=1: where the host spends its time, and which gaps of the busiest device were the
// GPU waiting for the host. A gap is host-bound when the runtime call that enqueued the kernel after
// it began after the gap began (the host had not yet asked for the work when the GPU ran dry).
template <class InWindow>
void report_host(std::FILE* out, double steps, InWindow&& in_window) {
  if (g_api.empty()) return;
  std::map<std::string, std::pair<std::uint64_t, std::uint64_t>> by_api;  // name -> (calls, ns)
  std::map<std::uint32_t, const ApiCall*> by_correlation;
  std::vector<const ApiCall*> ordered;
  for (const auto& a : g_api) {
    by_correlation[a.correlation] = &a;
    if (!starts_in_window(a.start)) continue;
    auto& slot = by_api[api_name(a.callback)];
    slot.first += 1;
    slot.second += a.end > a.start ? a.end - a.start : 0;
    ordered.push_back(&a);
  }
  std::sort(ordered.begin(), ordered.end(), [](const ApiCall* a, const ApiCall* b) { return a->start < b->start; });
  std::fprintf(out, "\n## Host: CUDA runtime calls per step\n\n| runtime function | calls per step | host ms per step | us per call |\n"
                    "| --- | ---: | ---: | ---: |\n");
  std::vector<std::pair<std::uint64_t, std::string>> sorted;
  for (const auto& [n, v] : by_api) sorted.emplace_back(v.second, n);
  std::sort(sorted.rbegin(), sorted.rend());
  for (std::size_t k = 0; k < sorted.size() && k < 15; ++k) {
    const auto& [ns, n] = sorted[k];
    const auto calls = by_api[n].first;
    std::fprintf(out, "| %s | %.1f | %.3f | %.1f |\n", n.c_str(), calls / steps, ns / steps / 1e6, calls ? ns / 1e3 / calls : 0.0);
  }
  // Who enqueued the memsets and copies: a runtime function of the program, or a library's own
  // driver call (cuBLASLt, cuDNN, NCCL), which has no runtime record.
  std::map<std::string, std::uint64_t> enqueued_by;
  for (const auto& i : g_intervals) {
    if (!in_window(i) || i.name.rfind("[mem", 0) != 0) continue;
    const auto found = by_correlation.find(i.correlation);
    enqueued_by[i.name + " by " + (found != by_correlation.end() ? api_name(found->second->callback) : "a library (driver call)")]++;
  }
  if (!enqueued_by.empty()) {
    std::fprintf(out, "\n| memset or copy, enqueued by | per step |\n| --- | ---: |\n");
    for (const auto& [n, count] : enqueued_by) std::fprintf(out, "| %s | %.1f |\n", n.c_str(), count / steps);
  }
  // The gaps of the busiest device, as report_gaps finds them.
  const auto [device, list] = busiest_device(in_window);
  if (list.empty()) return;
  std::uint64_t host_ns = 0, host_count = 0, device_ns = 0, device_count = 0, end = list.front()->end;
  std::map<std::string, std::pair<std::uint64_t, std::uint64_t>> during;  // runtime calls inside host-bound gaps
  for (std::size_t k = 1; k < list.size(); ++k) {
    const Interval* i = list[k];
    if (i->start > end + 2000) {
      const std::uint64_t gap = i->start - end;
      const auto found = by_correlation.find(i->correlation);
      if (found != by_correlation.end() && found->second->start > end) {
        host_ns += gap;
        ++host_count;
        // The runtime calls the host made between the GPU going idle and this launch.
        auto first = std::lower_bound(ordered.begin(), ordered.end(), end,
                                      [](const ApiCall* a, std::uint64_t t) { return a->start < t; });
        for (auto a = first; a != ordered.end() && (*a)->start <= found->second->start; ++a) {
          auto& slot = during[api_name((*a)->callback)];
          slot.first += 1;
          slot.second += (*a)->end > (*a)->start ? (*a)->end - (*a)->start : 0;
        }
      } else {
        device_ns += gap;
        ++device_count;
      }
    }
    end = std::max(end, i->end);
  }
  std::fprintf(out, "\n## Host-bound gaps on device %u\n\nGaps of >= 2 us where the next kernel was enqueued only after the GPU "
                    "had gone idle: %.1f per step, %.3f ms per step; the other gaps (enqueued before): %.1f per step, "
                    "%.3f ms per step.\n\n| runtime function called during host-bound gaps | calls per step | host ms per step |\n"
                    "| --- | ---: | ---: |\n",
               device, host_count / steps, host_ns / steps / 1e6, device_count / steps, device_ns / steps / 1e6);
  sorted.clear();
  for (const auto& [n, v] : during) sorted.emplace_back(v.second, n);
  std::sort(sorted.rbegin(), sorted.rend());
  for (std::size_t k = 0; k < sorted.size() && k < 10; ++k)
    std::fprintf(out, "| %s | %.1f | %.3f |\n", sorted[k].second.c_str(), during[sorted[k].second].first / steps,
                 sorted[k].first / steps / 1e6);
}

void report() {
  if (g_done.exchange(true)) return;
  cuptiActivityFlushAll(1);
  std::lock_guard lock(g_mutex);
  const char* path = std::getenv("STRATA_TRACE_OUT");
  std::FILE* out = path && *path ? std::fopen(path, "w") : stderr;
  if (!out) out = stderr;
  const char* steps_env = std::getenv("STRATA_TRACE_STEPS");
  const double steps = steps_env ? std::max(1.0, std::atof(steps_env)) : 1.0;
  if (g_window_open != 0) {  // started and never stopped: up to the last record
    std::uint64_t last = 0;
    for (const auto& i : g_intervals) last = std::max(last, i.end);
    g_windows.emplace_back(g_window_open, last);
  }
  auto in_window = [](const Interval& i) { return starts_in_window(i.start); };
  std::map<std::string, std::pair<std::uint64_t, std::uint64_t>> by_name;  // name -> (calls, ns)
  std::map<std::string, std::uint64_t> by_category;
  std::map<std::uint32_t, std::vector<std::pair<std::uint64_t, std::uint64_t>>> spans;
  std::uint64_t total = 0, first = UINT64_MAX, last = 0;
  for (const auto& i : g_intervals) {
    if (!in_window(i)) continue;
    const std::uint64_t ns = i.end > i.start ? i.end - i.start : 0;
    auto& slot = by_name[i.name];
    slot.first += 1;
    slot.second += ns;
    by_category[category(i.name)] += ns;
    spans[i.device].emplace_back(i.start, i.end);
    total += ns;
    first = std::min(first, i.start);
    last = std::max(last, i.end);
  }
  std::uint64_t wall = 0;
  if (g_window_seen)
    for (const auto& [s, e] : g_windows) wall += e - s;
  else if (last > first)
    wall = last - first;
  std::uint64_t busy = 0;
  for (auto& [device, list] : spans) busy = std::max(busy, union_length(list));
  const std::size_t devices = spans.size();
  std::fprintf(out, "# kernel trace (CUPTI): %s, %zu device(s), %.0f step(s)\n",
               g_window_seen ? "profiler window(s)" : "whole run", devices, steps);
  std::fprintf(out, "window wall time per step: %.3f ms; GPU busy per step (busiest device): %.3f ms (%.1f%%); "
                    "sum of kernel times per step: %.3f ms\n",
               wall / steps / 1e6, busy / steps / 1e6, wall ? 100.0 * busy / wall : 0.0, total / steps / 1e6);
  if (devices > 1)
    std::fprintf(out, "(sums over %zu devices: per-device time is about the sum / %zu)\n", devices, devices);
  std::fprintf(out, "\n| category | ms per step | share of kernel time |\n| --- | ---: | ---: |\n");
  std::vector<std::pair<std::uint64_t, std::string>> cats;
  for (const auto& [c, ns] : by_category) cats.emplace_back(ns, c);
  std::sort(cats.rbegin(), cats.rend());
  for (const auto& [ns, c] : cats)
    std::fprintf(out, "| %s | %.3f | %.1f%% |\n", c.c_str(), ns / steps / 1e6, total ? 100.0 * ns / total : 0.0);
  std::fprintf(out, "\n| kernel | category | calls per step | ms per step | us per call | share |\n| --- | --- | ---: | ---: | ---: | ---: |\n");
  std::vector<std::pair<std::uint64_t, std::string>> names;
  for (const auto& [n, v] : by_name) names.emplace_back(v.second, n);
  std::sort(names.rbegin(), names.rend());
  for (const auto& [ns, n] : names) {
    const auto calls = by_name[n].first;
    std::string shown = n.size() > 110 ? n.substr(0, 107) + "..." : n;
    for (char& c : shown)
      if (c == '|') c = '/';
    std::fprintf(out, "| %s | %s | %.1f | %.3f | %.1f | %.1f%% |\n", shown.c_str(), category(n).c_str(), calls / steps,
                 ns / steps / 1e6, calls ? ns / 1e3 / calls : 0.0, total ? 100.0 * ns / total : 0.0);
  }
  report_gaps(out, steps, in_window);
  report_overlap(out, steps, in_window);
  report_host(out, steps, in_window);
  if (out != stderr) std::fclose(out);
}

}  // namespace

extern "C" __attribute__((visibility("default"))) int InitializeInjection() {
  if (cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS) return 0;
  cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
  cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY);
  cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET);
  if (const char* host = std::getenv("STRATA_TRACE_HOST"); host && std::string(host) == "1")
    cuptiActivityEnable(CUPTI_ACTIVITY_KIND_RUNTIME);
  CUpti_SubscriberHandle subscriber;
  if (cuptiSubscribe(&subscriber, reinterpret_cast<CUpti_CallbackFunc>(on_api), nullptr) == CUPTI_SUCCESS) {
    cuptiEnableCallback(1, subscriber, CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_cudaProfilerStart_v4000);
    cuptiEnableCallback(1, subscriber, CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_cudaProfilerStop_v4000);
  }
  std::atexit(report);
  return 1;
}
