// strata/checkpoint/reshard.hpp: `ShardedCheckpoint`, all rank files of one saved iteration read
// as one set of global tensors, so any rank of any parallel layout can assemble its own shards.
//
// Every tensor in a rank file says which elements of which global tensor it holds (format.hpp):
// its global shape, its tensor-parallel ShardSpec, and the flat range [flat_begin, flat_begin + n)
// of that shard. ShardedCheckpoint opens the table of every rank file of the iteration (never the
// data) and indexes the pieces of each tensor name by (saved tensor-parallel rank, flat range).
// read(name, global, spec, flat_begin, out) then fills elements [flat_begin, flat_begin + n) of
// the shard `spec` of the global tensor -- any tensor-parallel size, any flat range (a distributed
// optimizer's share at any dp) -- by walking the wanted elements in runs that are contiguous both
// in the wanted shard and in one saved piece:
//
//   wanted local index --(ShardGeometry of spec)--> global index --(saved geometry)--> saved rank,
//   saved local index --> the piece holding it --> bytes in its file
//
// Before copying, the runs are gathered per piece, widened to the CRC chunks that hold them and
// merged, and exactly those chunks are read (positioned reads) and checked; bytes_read() counts
// them. A piece of the global tensor that no file holds is a FileError naming the tensor and the
// element; a global shape or dtype other than the caller's is a ConfigError, except for the
// vocabulary padding (ReadOptions::real_rows): the padded vocabulary depends on the tensor-parallel
// size, so the embedding and output tables may have more or fewer padding rows than saved; rows
// the checkpoint has are copied, rows past them are zero.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <cmath>
#include <type_traits>
#include <utility>
#include <vector>

#include "../core/error.hpp"
#include "../core/shape.hpp"
#include "../core/tensor.hpp"
#include "../shard/shard_spec.hpp"
#include "format.hpp"

STRATA_NAMESPACE_BEGIN

// Index arithmetic of the tensor-parallel shards of one global tensor, in runs: the global tensor
// is [outer, G, inner] around the split dimension G = stacks blocks of B; shard r holds, of every
// block, the r-th slice of b = B / parts rows.
class ShardGeometry {
 public:
  ShardGeometry(const Shape& global, const ShardSpec& spec) : numel_(global.numel()) {
    if (!spec.sharded || spec.parts == 1) return;
    sharded_ = true;
    const int dim = global.normalize(spec.dim);
    outer_ = 1;
    inner_ = 1;
    for (int d = 0; d < dim; ++d) outer_ *= global[d];
    for (int d = dim + 1; d < global.rank(); ++d) inner_ *= global[d];
    extent_ = global[dim];
    if (extent_ % (static_cast<index_t>(spec.stacks) * spec.parts) != 0)
      fail<ConfigError>("ShardGeometry: extent ", extent_, " of ", global.str(), " in ", spec.stacks,
                        " block(s) does not divide over ", spec.parts, " ranks");
    block_ = extent_ / spec.stacks;
    slice_ = block_ / spec.parts;
    local_extent_ = extent_ / spec.parts;
  }

  struct Run {
    int rank;       // the shard (0 when not sharded)
    index_t index;  // the index in the other numbering
    index_t length; // elements from here on that stay consecutive in both numberings
  };

  // Local element `local` of shard `rank` -> its global index.
  Run to_global(index_t local, int rank) const {
    if (!sharded_) return {0, local, numel_ - local};
    const index_t plane = local_extent_ * inner_;
    const index_t o = local / plane, c = (local % plane) / inner_, j = local % inner_;
    const index_t block = c / slice_, w = c % slice_;
    const index_t g = (o * extent_ + block * block_ + static_cast<index_t>(rank) * slice_ + w) * inner_ + j;
    return {rank, g, (slice_ - w) * inner_ - j};
  }
  // Global element `global` -> the shard holding it and its local index there.
  Run to_local(index_t global) const {
    if (!sharded_) return {0, global, numel_ - global};
    const index_t plane = extent_ * inner_;
    const index_t o = global / plane, cg = (global % plane) / inner_, j = global % inner_;
    const index_t block = cg / block_, within = cg % block_;
    const int rank = static_cast<int>(within / slice_);
    const index_t w = within % slice_;
    return {rank, (o * local_extent_ + block * slice_ + w) * inner_ + j, (slice_ - w) * inner_ - j};
  }

 private:
  bool sharded_ = false;
  index_t numel_ = 0;
  index_t outer_ = 1, inner_ = 1, extent_ = 1, block_ = 1, slice_ = 1, local_extent_ = 1;
};

class ShardedCheckpoint {
 public:
  struct ReadOptions {
    // The real vocabulary when the tensor is a vocabulary table padded to the tensor-parallel size:
    // the saved and wanted global shapes may then differ in dimension 0 (both at least real_rows).
    index_t real_rows = -1;
  };

  // One saved piece: elements [begin, end) of saved tensor-parallel shard `rank`.
  struct Piece {
    int file;
    std::size_t record;
    int rank;
    index_t begin, end;
  };
  struct Entry {
    std::string name;
    Shape global_shape;
    StoredDtype dtype;
    ShardSpec shard;  // the saved split (rank 0)
    std::vector<Piece> pieces;  // sorted by (rank, begin), disjoint
  };

  // Opens the table of every rank file in `iteration_dir` (rank_00000.strata says how many there are).
  explicit ShardedCheckpoint(std::filesystem::path iteration_dir) : dir_(std::move(iteration_dir)) {
    files_.emplace_back(dir_ / rank_name(0));
    const std::int64_t world = files_.front().get_int("parallel.world_size");
    if (world < 1 || world > kMaxCheckpointRanks)
      fail<FileError>("checkpoint file ", files_.front().path(), " records a world size of ", world);
    for (int r = 1; r < world; ++r) {
      const std::filesystem::path file = dir_ / rank_name(r);
      std::error_code ec;
      if (!std::filesystem::exists(file, ec))
        fail<FileError>("checkpoint ", dir_, " is incomplete: it was saved by ", world, " ranks but ", file,
                        " does not exist");
      files_.emplace_back(file);
    }
    const std::int64_t iteration = files_.front().get_int("train.iteration");
    for (StateReader& f : files_) {
      if (f.get_int("train.iteration") != iteration)
        fail<FileError>("checkpoint ", dir_, " mixes iterations: ", f.path(), " records ", f.get_int("train.iteration"),
                        ", ", files_.front().path(), " records ", iteration);
      if (f.get_int("parallel.world_size") != world)
        fail<FileError>("checkpoint ", dir_, " mixes layouts: ", f.path(), " records a world size of ",
                        f.get_int("parallel.world_size"), ", ", files_.front().path(), " ", world);
    }
    index();
  }

  const std::filesystem::path& directory() const { return dir_; }
  // Rank 0's file: the scalars of the training state.
  StateReader& first() { return files_.front(); }
  const StateReader& first() const { return files_.front(); }
  int files() const { return static_cast<int>(files_.size()); }
  StateReader& file(int i) { return files_.at(static_cast<std::size_t>(i)); }

  bool has_tensor(std::string_view name) const { return entries_.find(name) != entries_.end(); }
  const Entry& entry(std::string_view name) const {
    auto it = entries_.find(name);
    if (it == entries_.end()) fail<FileError>("checkpoint ", dir_, " has no tensor '", name, "'");
    return it->second;
  }
  const std::map<std::string, Entry, std::less<>>& entries() const { return entries_; }
  // Bytes of tensor data read so far (whole CRC chunks).
  std::uint64_t bytes_read() const { return bytes_read_; }

  // Elements [flat_begin, flat_begin + out.size()) of the shard `spec` of tensor `name`, whose
  // global shape is `global` (host memory).
  template <class X>
  void read(std::string_view name, const Shape& global, const ShardSpec& spec, index_t flat_begin, std::span<X> out,
            const ReadOptions& options = {}) {
    const Entry& e = entry(name);
    if (e.dtype != stored_dtype<X>())
      fail<ConfigError>("checkpoint ", dir_, ": tensor '", name, "' is stored as ", stored_dtype_name(e.dtype),
                        " but is being loaded into a ", stored_dtype_name(stored_dtype<X>()), " tensor");
    const index_t saved_limit = saved_elements(e, global, options);
    const index_t count = static_cast<index_t>(out.size());
    if (flat_begin < 0 || flat_begin + count > local_shape(global, spec).numel())
      fail<ConfigError>("ShardedCheckpoint::read: elements [", flat_begin, ", ", flat_begin + count, ") of '", name,
                        "' lie outside its ", format_shard(spec), " shard of ", global.str());
    const ShardGeometry wanted(global, spec), saved(e.global_shape, e.shard);
    // Pass 1: the element ranges of each piece that are needed, widened to whole CRC chunks.
    std::map<std::size_t, std::vector<std::pair<std::uint64_t, std::uint64_t>>> needed;  // piece -> byte ranges
    const std::uint64_t element = sizeof(X);
    walk(e, wanted, saved, spec.rank, flat_begin, count, saved_limit,
         [&](std::size_t piece, index_t at, index_t, index_t n) {
           const TensorRecord& r = files_[static_cast<std::size_t>(e.pieces[piece].file)].tensors()[e.pieces[piece].record];
           const std::uint64_t lo = static_cast<std::uint64_t>(at) * element, hi = lo + static_cast<std::uint64_t>(n) * element;
           needed[piece].emplace_back(lo / r.chunk_bytes * r.chunk_bytes, std::min(r.bytes, (hi + r.chunk_bytes - 1) / r.chunk_bytes * r.chunk_bytes));
         },
         [](index_t, index_t) {});
    // Pass 2: read those chunks (merged), each checked against its CRC.
    std::map<std::size_t, std::pair<std::uint64_t, std::vector<std::byte>>> data;  // piece -> (first byte, bytes)
    for (auto& [piece, ranges] : needed) {
      std::sort(ranges.begin(), ranges.end());
      const Piece& p = e.pieces[piece];
      StateReader& file = files_[static_cast<std::size_t>(p.file)];
      const TensorRecord& r = file.tensors()[p.record];
      auto& [first, bytes] = data[piece];
      first = ranges.front().first;
      std::uint64_t end = 0;
      for (const auto& range : ranges) end = std::max(end, range.second);
      bytes.resize(static_cast<std::size_t>(end - first));
      std::uint64_t lo = ranges.front().first, hi = ranges.front().second;
      auto flush = [&] {
        file.read_bytes(r, lo, std::span<std::byte>(bytes).subspan(static_cast<std::size_t>(lo - first), static_cast<std::size_t>(hi - lo)));
        bytes_read_ += hi - lo;
      };
      for (const auto& [a, b] : ranges) {
        if (a > hi) {
          flush();
          lo = a;
          hi = b;
        } else {
          hi = std::max(hi, b);
        }
      }
      flush();
    }
    // Pass 3: copy.
    std::byte* target = reinterpret_cast<std::byte*>(out.data());
    walk(e, wanted, saved, spec.rank, flat_begin, count, saved_limit,
         [&](std::size_t piece, index_t at, index_t to, index_t n) {
           const auto& [first, bytes] = data.at(piece);
           const std::byte* from = bytes.data() + (static_cast<std::uint64_t>(at) * element - first);
           std::memcpy(target + static_cast<std::size_t>(to) * element, from, static_cast<std::size_t>(n) * element);
           if constexpr (std::is_floating_point_v<X> || std::is_same_v<X, bf16> || std::is_same_v<X, fp16>) {
             // A diverged run's weights, refused here rather than blamed on the learning rate later.
             const X* values = reinterpret_cast<const X*>(target) + to;
             for (index_t k = 0; k < n; ++k)
               if (!std::isfinite(static_cast<double>(values[k])))
                 fail<FileError>("checkpoint file ", files_[static_cast<std::size_t>(e.pieces[piece].file)].path(), ": tensor '", name,
                                 "' holds a non-finite value (", static_cast<double>(values[k]), ") at element ", at + k,
                                 " of its piece in that file; the run that saved it had diverged: load an earlier iteration");
           }
         },
         [&](index_t to, index_t n) {
           std::memset(target + static_cast<std::size_t>(to) * element, 0, static_cast<std::size_t>(n) * element);
         });
  }

  // Elements [begin, begin + count) of `out` (any memory space) = elements [flat_begin, flat_begin +
  // count) of the shard `spec` of `name`.
  template <class X, class Space>
  void read_into(std::string_view name, Tensor<X, Space>& out, index_t begin, index_t count, const Shape& global,
                 const ShardSpec& spec, index_t flat_begin, const ReadOptions& options = {}) {
    if (begin < 0 || count < 0 || begin + count > out.numel())
      fail<ConfigError>("ShardedCheckpoint::read_into: elements [", begin, ", ", begin + count, ") of a tensor of ",
                        out.numel());
    if constexpr (std::is_same_v<Space, space::host>) {
      read<X>(name, global, spec, flat_begin, std::span<X>(out.data() + begin, static_cast<std::size_t>(count)), options);
    } else {
      Tensor<X> host = Tensor<X>::empty(Shape{count});
      read<X>(name, global, spec, flat_begin, host.span(), options);
      Tensor<X, Space> window = Tensor<X, Space>::alias(out, begin, Shape{count});
      strata::copy(window, host);
    }
  }
  // A whole shard.
  template <class X, class Space>
  void read_into(std::string_view name, Tensor<X, Space>& out, const Shape& global, const ShardSpec& spec,
                 const ReadOptions& options = {}) {
    if (!(out.shape() == local_shape(global, spec)))
      fail<ConfigError>("ShardedCheckpoint::read_into: '", name, "' is loaded into a tensor of shape ", out.shape().str(),
                        " but its ", format_shard(spec), " shard of ", global.str(), " has shape ",
                        local_shape(global, spec).str());
    read_into(name, out, 0, out.numel(), global, spec, 0, options);
  }

 private:
  static std::string rank_name(int rank) {
    char buffer[32];
    std::snprintf(buffer, sizeof buffer, "rank_%05d.strata", rank);
    return buffer;
  }

  void index() {
    for (std::size_t f = 0; f < files_.size(); ++f) {
      const auto& records = files_[f].tensors();
      for (std::size_t i = 0; i < records.size(); ++i) {
        const TensorRecord& r = records[i];
        auto [it, fresh] = entries_.try_emplace(r.name);
        Entry& e = it->second;
        ShardSpec spec = r.shard;
        const int rank = spec.sharded ? spec.rank : 0;
        spec.rank = 0;
        if (fresh) {
          e = Entry{r.name, r.global_shape, r.dtype, spec, {}};
        } else if (!(e.global_shape == r.global_shape) || e.dtype != r.dtype || !same_shard(e.shard, spec)) {
          const StateReader& other = files_[static_cast<std::size_t>(e.pieces.front().file)];
          fail<FileError>("checkpoint ", dir_, " is inconsistent: tensor '", r.name, "' is ", r.global_shape.str(), " ",
                          stored_dtype_name(r.dtype), " ", format_shard(r.shard), " in ", files_[f].path(), " but ",
                          e.global_shape.str(), " ", stored_dtype_name(e.dtype), " ", format_shard(e.shard), " in ",
                          other.path());
        }
        e.pieces.push_back(Piece{static_cast<int>(f), i, rank, r.flat_begin, r.flat_begin + r.numel()});
      }
    }
    for (auto& [name, e] : entries_) {
      std::sort(e.pieces.begin(), e.pieces.end(), [](const Piece& a, const Piece& b) {
        return a.rank != b.rank ? a.rank < b.rank : a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
      });
      // Identical pieces are replicas (files written before replicas were skipped); keep one.
      std::vector<Piece> unique;
      for (const Piece& p : e.pieces) {
        if (!unique.empty() && unique.back().rank == p.rank && unique.back().begin == p.begin && unique.back().end == p.end)
          continue;
        if (!unique.empty() && unique.back().rank == p.rank && p.begin < unique.back().end)
          fail<FileError>("checkpoint ", dir_, " is inconsistent: pieces of tensor '", name, "' overlap (elements [",
                          unique.back().begin, ", ", unique.back().end, ") in ",
                          files_[static_cast<std::size_t>(unique.back().file)].path(), " and [", p.begin, ", ", p.end,
                          ") in ", files_[static_cast<std::size_t>(p.file)].path(), ")");
        unique.push_back(p);
      }
      e.pieces = std::move(unique);
    }
  }

  // Elements of the wanted global tensor that the checkpoint has (the rest are padding rows).
  index_t saved_elements(const Entry& e, const Shape& global, const ReadOptions& options) const {
    if (e.global_shape == global) return global.numel();
    bool rows_only = e.global_shape.rank() == global.rank() && global.rank() >= 1 && options.real_rows >= 0 &&
                     e.global_shape[0] >= options.real_rows && global[0] >= options.real_rows;
    for (int d = 1; rows_only && d < global.rank(); ++d) rows_only = e.global_shape[d] == global[d];
    if (!rows_only)
      fail<ConfigError>("checkpoint ", dir_, ": tensor '", e.name, "' has global shape ", e.global_shape.str(),
                        " but the model's is ", global.str());
    return std::min(e.global_shape[0], global[0]) * (global.numel() / std::max<index_t>(global[0], 1));
  }

  // Calls copy(piece, index in the piece, index in the output, n) or zero(index in the output, n)
  // for runs covering wanted elements [flat_begin, flat_begin + count) of shard `rank`.
  template <class Copy, class Zero>
  void walk(const Entry& e, const ShardGeometry& wanted, const ShardGeometry& saved, int rank, index_t flat_begin,
            index_t count, index_t saved_limit, Copy&& copy, Zero&& zero) const {
    index_t done = 0;
    while (done < count) {
      const ShardGeometry::Run g = wanted.to_global(flat_begin + done, rank);
      index_t n = std::min(g.length, count - done);
      if (g.index >= saved_limit) {
        zero(done, n);
        done += n;
        continue;
      }
      n = std::min(n, saved_limit - g.index);
      const ShardGeometry::Run s = saved.to_local(g.index);
      n = std::min(n, s.length);
      // The piece of saved shard s.rank holding s.index.
      auto it = std::upper_bound(e.pieces.begin(), e.pieces.end(), std::pair<int, index_t>{s.rank, s.index},
                                 [](const std::pair<int, index_t>& key, const Piece& p) {
                                   return key.first != p.rank ? key.first < p.rank : key.second < p.begin;
                                 });
      if (it == e.pieces.begin() || std::prev(it)->rank != s.rank || std::prev(it)->end <= s.index)
        fail<FileError>("checkpoint ", dir_, " holds no data for element ", s.index, " of ",
                        e.shard.sharded ? detail::concat("saved shard ", s.rank, " of ") : std::string(), "tensor '",
                        e.name, "' (global element ", g.index, " of ", e.global_shape.str(),
                        "): a rank file that should hold it is missing or was written by another run");
      const Piece& p = *std::prev(it);
      n = std::min(n, p.end - s.index);
      copy(static_cast<std::size_t>(std::prev(it) - e.pieces.begin()), s.index - p.begin, done, n);
      done += n;
    }
  }

  std::filesystem::path dir_;
  std::vector<StateReader> files_;
  std::map<std::string, Entry, std::less<>> entries_;
  std::uint64_t bytes_read_ = 0;
};

STRATA_NAMESPACE_END
