// strata/shard/rank_generator.hpp: global rank <-> per-axis coordinates, and the process groups of
// any set of axes, numbered exactly as Megatron-Core's RankGenerator.get_ranks numbers them.
//
// The order string (default "tp-cp-ep-dp-pp") lists the axes from fastest to slowest varying:
//     rank = tp_i + tp * (cp_i + cp * (ep_i + ep * (dp_i + dp * pp_i)))
// An axis whose size is 1 may be left out of the order (it is appended at the end, as Megatron
// does); an axis of size > 1 must be named.
//
// Like Megatron, two generators share one order:
// - dense layers: sizes tp, cp, dp, pp (ep counts as 1);
// - expert layers: sizes etp (in the "tp" slot), ep, edp = expert_dp() (in the "dp" slot), pp
//   (cp counts as 1).
// Axis sets are names joined by '-': tp, cp, dp, pp name dense axes; etp, ep, edp name expert
// axes (pp belongs to both). A group of an axis set varies those axes and holds the others fixed;
// the order of names in the set does not matter ("dp-cp" is "cp-dp"). Groups are numbered by the
// fixed axes and members by the varied axes, both in the order string's fastest-first order, which
// is Megatron's generate_masked_orthogonal_rank_groups. The pipeline groups of the two generators
// must agree (Megatron asserts the same): always true when pp is the slowest axis or pp == 1;
// otherwise expert_dp() must equal dp and the two pipeline groupings are compared rank by rank.
//
// `Coordinates{tp, cp, ep, dp, pp}` are a rank's dense coordinates (dp is the full dense
// data-parallel index) plus ep, the rank's expert-parallel index, which the others determine
// (it is the ep coordinate of the expert decomposition; with the default order,
// ep_i = ((tp_i + tp*(cp_i + cp*dp_i)) / etp) % ep, so with etp == tp and cp == 1 it is dp_i % ep).
// `rank_of` reads tp, cp, dp, pp and ignores ep; `expert_coordinates` gives {etp, ep, edp, pp}.
#pragma once

#include <array>
#include <string_view>
#include <vector>

#include "parallel_config.hpp"

STRATA_NAMESPACE_BEGIN

// Megatron's axis tokens, as they appear in an order string.
enum class Axis : int { tp = 0, cp = 1, ep = 2, dp = 3, pp = 4 };

struct Coordinates {
  int tp = 0;
  int cp = 0;
  int ep = 0;  // expert-parallel index, derived from the others (rank_of ignores it)
  int dp = 0;  // full data-parallel index of dense layers, 0 <= dp < config.dp
  int pp = 0;
  friend constexpr bool operator==(const Coordinates&, const Coordinates&) = default;
};

// A rank's coordinates as expert layers see it.
struct ExpertCoordinates {
  int etp = 0;
  int ep = 0;
  int edp = 0;  // expert data-parallel index, 0 <= edp < config.expert_dp()
  int pp = 0;
  friend constexpr bool operator==(const ExpertCoordinates&, const ExpertCoordinates&) = default;
};

class RankGenerator {
 public:
  static constexpr std::string_view kDefaultOrder = "tp-cp-ep-dp-pp";
  static constexpr int kAxes = 5;

  constexpr explicit RankGenerator(ParallelConfig config, std::string_view order = kDefaultOrder) : config_(config) {
    raise_if(validate(config));
    parse_order(order);
    const int dense[kAxes] = {config.tp, config.cp, 1, config.dp, config.pp};
    const int expert[kAxes] = {config.etp, 1, config.ep, config.expert_dp(), config.pp};
    int dense_stride = 1, expert_stride = 1;
    for (int k = 0; k < kAxes; ++k) {
      const int axis = static_cast<int>(order_[k]);
      dense_.size[k] = dense[axis];
      dense_.stride[k] = dense_stride;
      dense_stride *= dense[axis];
      expert_.size[k] = expert[axis];
      expert_.stride[k] = expert_stride;
      expert_stride *= expert[axis];
    }
    check_pipeline_groups_agree(order);
  }

  constexpr const ParallelConfig& config() const { return config_; }
  constexpr int world_size() const { return config_.world_size(); }
  // The axes from fastest to slowest varying (the order string, completed).
  constexpr const std::array<Axis, kAxes>& order() const { return order_; }

  constexpr Coordinates coordinates(int rank) const {
    check_rank(rank);
    Coordinates c;
    c.tp = coordinate(dense_, rank, Axis::tp);
    c.cp = coordinate(dense_, rank, Axis::cp);
    c.ep = coordinate(expert_, rank, Axis::ep);
    c.dp = coordinate(dense_, rank, Axis::dp);
    c.pp = coordinate(dense_, rank, Axis::pp);
    return c;
  }
  constexpr ExpertCoordinates expert_coordinates(int rank) const {
    check_rank(rank);
    return {coordinate(expert_, rank, Axis::tp), coordinate(expert_, rank, Axis::ep), coordinate(expert_, rank, Axis::dp),
            coordinate(expert_, rank, Axis::pp)};
  }
  // The rank at dense coordinates (tp, cp, dp, pp); c.ep is not read.
  constexpr int rank_of(const Coordinates& c) const {
    check_coordinate("tp", c.tp, config_.tp);
    check_coordinate("cp", c.cp, config_.cp);
    check_coordinate("dp", c.dp, config_.dp);
    check_coordinate("pp", c.pp, config_.pp);
    return c.tp * stride_of(dense_, Axis::tp) + c.cp * stride_of(dense_, Axis::cp) + c.dp * stride_of(dense_, Axis::dp) +
           c.pp * stride_of(dense_, Axis::pp);
  }
  constexpr int rank_of(const ExpertCoordinates& c) const {
    check_coordinate("etp", c.etp, config_.etp);
    check_coordinate("ep", c.ep, config_.ep);
    check_coordinate("edp", c.edp, config_.expert_dp());
    check_coordinate("pp", c.pp, config_.pp);
    return c.etp * stride_of(expert_, Axis::tp) + c.ep * stride_of(expert_, Axis::ep) + c.edp * stride_of(expert_, Axis::dp) +
           c.pp * stride_of(expert_, Axis::pp);
  }

  // Ranks in each group of `axes` (the product of their sizes).
  constexpr int group_size(std::string_view axes) const {
    const AxisSet set = parse_axes(axes);
    const Layout& layout = set.expert ? expert_ : dense_;
    int size = 1;
    for (int k = 0; k < kAxes; ++k)
      if (set.has(order_[k])) size *= layout.size[k];
    return size;
  }
  constexpr int group_count(std::string_view axes) const { return world_size() / group_size(axes); }

  // Member i of group g of `axes`: Megatron's get_ranks(axes)[g][i].
  constexpr int group_member(std::string_view axes, int group, int i) const {
    const AxisSet set = parse_axes(axes);
    const Layout& layout = set.expert ? expert_ : dense_;
    const int size = group_size(axes);
    const int count = world_size() / size;
    if (group < 0 || group >= count)
      raise_if(Problem::sentence("group=", group, " is outside the ", count, " groups of '", axes,
                                 "'; groups are numbered 0 to ", count - 1, "."));
    if (i < 0 || i >= size)
      raise_if(Problem::sentence("member i=", i, " is outside a group of '", axes, "' with ", size,
                                 " ranks; members are numbered 0 to ", size - 1, "."));
    int rank = 0;
    for (int k = 0; k < kAxes; ++k) {
      int& rest = set.has(order_[k]) ? i : group;
      rank += (rest % layout.size[k]) * layout.stride[k];
      rest /= layout.size[k];
    }
    return rank;
  }
  // Which group of `axes` holds `rank`, and where in it: group_member(axes, g, p) == rank.
  constexpr int group_index_of(int rank, std::string_view axes) const { return locate(rank, axes).group; }
  constexpr int position_in_group(int rank, std::string_view axes) const { return locate(rank, axes).position; }

  // All groups of `axes`, as Megatron's get_ranks(axes) lists them.
  constexpr std::vector<std::vector<int>> groups(std::string_view axes) const {
    const int size = group_size(axes), count = world_size() / size;
    std::vector<std::vector<int>> out(static_cast<std::size_t>(count));
    for (int g = 0; g < count; ++g) {
      out[g].reserve(static_cast<std::size_t>(size));
      for (int i = 0; i < size; ++i) out[g].push_back(group_member(axes, g, i));
    }
    return out;
  }
  // The group of `axes` that holds `rank`.
  constexpr std::vector<int> group_of(int rank, std::string_view axes) const {
    const int g = group_index_of(rank, axes), size = group_size(axes);
    std::vector<int> out;
    out.reserve(static_cast<std::size_t>(size));
    for (int i = 0; i < size; ++i) out.push_back(group_member(axes, g, i));
    return out;
  }

  // The neighbours in the rank's pipeline group (wrapping around from the last stage to the first).
  constexpr int next_pipeline_rank(int rank) const {
    const Location at = locate(rank, "pp");
    return group_member("pp", at.group, (at.position + 1) % config_.pp);
  }
  constexpr int prev_pipeline_rank(int rank) const {
    const Location at = locate(rank, "pp");
    return group_member("pp", at.group, (at.position + config_.pp - 1) % config_.pp);
  }

 private:
  struct Layout {
    int size[kAxes] = {1, 1, 1, 1, 1};    // by position in the order
    int stride[kAxes] = {1, 1, 1, 1, 1};  // by position in the order
  };
  struct AxisSet {
    unsigned mask = 0;  // bit (1 << Axis)
    bool expert = false;
    constexpr bool has(Axis a) const { return (mask >> static_cast<int>(a)) & 1u; }
  };
  struct Location {
    int group = 0;
    int position = 0;
  };

  static constexpr bool next_token(std::string_view& rest, std::string_view& token) {
    if (rest.empty()) return false;
    const std::size_t dash = rest.find('-');
    token = rest.substr(0, dash);
    rest = dash == std::string_view::npos ? std::string_view{} : rest.substr(dash + 1);
    return true;
  }

  constexpr void parse_order(std::string_view order) {
    bool named[kAxes] = {};
    int count = 0;
    std::string_view rest = order, token;
    if (order.empty() || order.back() == '-')
      raise_if(Problem::sentence("the rank order '", order,
                                 "' is not a list of axes; name the axes from fastest to slowest varying, joined by "
                                 "'-', for example '",
                                 kDefaultOrder, "'."));
    while (!rest.empty()) {
      next_token(rest, token);
      int axis = -1;
      if (token == "tp") axis = 0;
      else if (token == "cp") axis = 1;
      else if (token == "ep") axis = 2;
      else if (token == "dp") axis = 3;
      else if (token == "pp") axis = 4;
      if (axis < 0)
        raise_if(Problem::sentence("the rank order '", order, "' names '", token,
                                   "', which is not an axis; use tp, cp, ep, dp and pp joined by '-', for example '",
                                   kDefaultOrder, "'."));
      if (named[axis])
        raise_if(Problem::sentence("the rank order '", order, "' names ", token, " twice; name each axis once."));
      named[axis] = true;
      order_[count++] = static_cast<Axis>(axis);
    }
    const char* names[kAxes] = {"tp", "cp", "ep", "dp", "pp"};
    const int largest[kAxes] = {config_.tp > config_.etp ? config_.tp : config_.etp, config_.cp, config_.ep,
                                config_.dp > config_.expert_dp() ? config_.dp : config_.expert_dp(), config_.pp};
    for (int axis = 0; axis < kAxes; ++axis) {
      if (named[axis]) continue;
      if (largest[axis] != 1)
        raise_if(Problem::sentence("the rank order '", order, "' leaves out ", names[axis], ", whose size is ", largest[axis],
                                   "; name every axis whose size is above 1 (the default order is ", kDefaultOrder, ")."));
      order_[count++] = static_cast<Axis>(axis);
    }
  }

  constexpr void check_pipeline_groups_agree(std::string_view order) const {
    if (config_.pp == 1 || order_[kAxes - 1] == Axis::pp) return;
    if (config_.expert_dp() != config_.dp)
      raise_if(Problem::sentence("the rank order '", order, "' does not end with pp, which needs expert layers to keep as "
                                 "many data-parallel replicas as dense layers, but expert_dp=",
                                 config_.expert_dp(), " and dp=", config_.dp, "; make pp the last axis of the order."));
    const AxisSet pp_only{1u << static_cast<int>(Axis::pp), false};
    for (int rank = 0; rank < world_size(); ++rank) {
      const Location dense = locate_in(dense_, pp_only, rank), expert = locate_in(expert_, pp_only, rank);
      if (dense.group != expert.group || dense.position != expert.position)
        raise_if(Problem::sentence("with the rank order '", order,
                                   "', dense and expert layers disagree on the pipeline group of rank ", rank,
                                   "; make pp the last axis of the order."));
    }
  }

  constexpr AxisSet parse_axes(std::string_view axes) const {
    AxisSet set;
    bool dense_only = false, expert_only = false;
    std::string_view rest = axes, token;
    if (axes.empty() || axes.back() == '-')
      raise_if(Problem::sentence("the axis set '", axes,
                                 "' is not a list of axes; join names with '-': tp, cp, dp, pp for dense layers, or "
                                 "etp, ep, edp, pp for expert layers (for example 'tp-cp')."));
    while (next_token(rest, token)) {
      int axis = -1;
      if (token == "tp") axis = 0, dense_only = true;
      else if (token == "cp") axis = 1, dense_only = true;
      else if (token == "dp") axis = 3, dense_only = true;
      else if (token == "pp") axis = 4;
      else if (token == "etp") axis = 0, expert_only = true;
      else if (token == "ep") axis = 2, expert_only = true;
      else if (token == "edp") axis = 3, expert_only = true;
      if (axis < 0)
        raise_if(Problem::sentence("the axis set '", axes, "' names '", token,
                                   "', which is not a parallel axis; use tp, cp, dp, pp for dense layers, or etp, ep, "
                                   "edp, pp for expert layers, joined by '-' (for example 'tp-cp')."));
      if ((set.mask >> axis) & 1u)
        raise_if(Problem::sentence("the axis set '", axes, "' names ", token, " twice; name each axis once."));
      set.mask |= 1u << axis;
    }
    if (dense_only && expert_only)
      raise_if(Problem::sentence("the axis set '", axes,
                                 "' mixes dense-layer axes (tp, cp, dp) with expert-layer axes (etp, ep, edp); the two "
                                 "regroup the same ranks differently, so use one family, for example 'etp-ep'."));
    set.expert = expert_only;
    return set;
  }

  constexpr Location locate(int rank, std::string_view axes) const {
    check_rank(rank);
    const AxisSet set = parse_axes(axes);
    return locate_in(set.expert ? expert_ : dense_, set, rank);
  }
  constexpr Location locate_in(const Layout& layout, const AxisSet& set, int rank) const {
    Location at;
    int group_scale = 1, position_scale = 1;
    for (int k = 0; k < kAxes; ++k) {
      const int c = rank / layout.stride[k] % layout.size[k];
      if (set.has(order_[k])) {
        at.position += c * position_scale;
        position_scale *= layout.size[k];
      } else {
        at.group += c * group_scale;
        group_scale *= layout.size[k];
      }
    }
    return at;
  }

  constexpr int position_of(Axis a) const {
    int k = 0;
    while (order_[k] != a) ++k;
    return k;
  }
  constexpr int coordinate(const Layout& layout, int rank, Axis a) const {
    const int k = position_of(a);
    return rank / layout.stride[k] % layout.size[k];
  }
  constexpr int stride_of(const Layout& layout, Axis a) const { return layout.stride[position_of(a)]; }

  constexpr void check_rank(int rank) const {
    if (rank < 0 || rank >= world_size())
      raise_if(Problem::sentence("rank=", rank, " is outside the world of ", world_size(), " ranks (tp=", config_.tp,
                                 " x pp=", config_.pp, " x dp=", config_.dp, " x cp=", config_.cp,
                                 "); ranks are numbered 0 to ", world_size() - 1, "."));
  }
  static constexpr void check_coordinate(const char* name, int value, int size) {
    if (value < 0 || value >= size)
      raise_if(Problem::sentence("coordinate ", name, "=", value, " is outside the axis of size ", size,
                                 "; coordinates are numbered 0 to ", size - 1, "."));
  }

  ParallelConfig config_;
  std::array<Axis, kAxes> order_{Axis::tp, Axis::cp, Axis::ep, Axis::dp, Axis::pp};
  Layout dense_{};
  Layout expert_{};
};

STRATA_NAMESPACE_END
