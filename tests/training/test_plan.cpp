// strata-plan's planner (examples/tools/plan/): the enumeration against a hand count, validity
// through the trainers' own validation, memory equal to plan_memory, the calibration file's checks,
// and the predictions beside the runs recorded in bench/RESULTS.md (bench/calibration/README.md).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "tools/plan/calibrate.hpp"
#include "tools/plan/planner.hpp"

#ifndef STRATA_SOURCE_DIR
#error "STRATA_SOURCE_DIR must name the source tree (the calibration file lives there)"
#endif

namespace {

using strata::models::RecomputeGranularity;

trainer::TrainArgs tiny_gpt() {
  return trainer::parse_flags("gpt", {"--num-layers", "4", "--hidden-size", "128", "--num-attention-heads", "4", "--seq-length", "128",
                                      "--global-batch-size", "8", "--vocab-size", "257"});
}

plan::Calibration h100() { return plan::load_calibration(std::string(STRATA_SOURCE_DIR) + "/bench/calibration/h100_node.json"); }
// Written by `strata-plan --calibrate` on one H200 (GEMMs and copies measured; links from h100_node.json).
plan::Calibration h200_measured() {
  return plan::load_calibration(std::string(STRATA_SOURCE_DIR) + "/bench/calibration/h200_measured.json");
}
// Written by `strata-plan --calibrate` on one H100 (2026-12-06: bf16 and FP8 GEMMs at 60 shapes, copies,
// cuDNN attention by length with both backwards; links from h100_node.json).
plan::Calibration h100_measured() {
  return plan::load_calibration(std::string(STRATA_SOURCE_DIR) + "/bench/calibration/h100_measured.json");
}

// Hand count for 1 node x 4 GPUs, 4 layers, global batch 8 (micro-batches 1, 2, 4, 8; 3 recompute
// choices; the distributed optimizer off, and on where dp x cp > 1):
//   tp=1 cp=1: pp=1 (dp 4): 1 schedule x 4 x 3 x 2 = 24; pp=2 (dp 2): 1f1b, zero-bubble, interleaved v=2:
//              3 x 4 x 3 x 2 = 72; pp=4 (dp 1): 1f1b, zero-bubble: 2 x 4 x 3 x 1 = 24
//   tp=1 cp=2: pp=1 (dp 2): 24; pp=2 (dp 1, dp x cp = 2): 3 x 4 x 3 x 2 = 72
//   tp=1 cp=4: pp=1: 24
//   tp=2 cp=1: pp=1 (dp 2): 24; pp=2 (dp 1): 3 x 4 x 3 x 1 = 36;  tp=2 cp=2: pp=1: 24
//   tp=4: 1 x 4 x 3 x 1 = 12
//   total 240 + 84 + 12 = 336.
TEST(Plan, EnumerationCountMatchesHandCount) {
  const auto layouts = plan::enumerate_layouts(tiny_gpt(), plan::Cluster{4, 1, 80});
  EXPECT_EQ(layouts.size(), 336u);
  int interleaved = 0, distributed = 0;
  for (const auto& l : layouts) {
    EXPECT_EQ(l.tp * l.pp * l.cp * l.dp, 4);
    interleaved += l.schedule == "interleaved";
    distributed += l.distributed_optimizer;
  }
  EXPECT_EQ(interleaved, 24 + 24 + 12);  // v=2 at tp1 cp1 pp2 (dp 2) and tp1 cp2 pp2 (dp x cp = 2): 4 x 3 x 2 each; tp2 pp2: 4 x 3
  EXPECT_EQ(distributed, (24 + 72 + 24 + 72 + 24 + 24 + 24) / 2);
}

// The refusals by hand (the trainers' validation stops at the first reason, in its order); context
// parallelism runs on GPUs, so no cp > 1 layout is refused for being one:
//   the global batch 8 not a multiple of micro-batch x dp: (mbs 4 or 8, dp 4) at tp1 cp1 pp1: 2 x 3 x 2 = 12;
//     (mbs 8, dp 2) at tp1 cp1 pp2 (3 schedules): 3 x 3 x 2 = 18, at tp2 pp1: 3 x 2 = 6, at tp1 cp2 pp1:
//     3 x 2 = 6; in all 42;
//   the interleaved schedule with 1 micro-batch (not a multiple of pp = 2): tp1 pp2 dp2 mbs 4: 3 x 2 = 6,
//     tp2 pp2 dp1 mbs 8: 3, tp1 cp2 pp2 dp1 mbs 8: 3 x 2 = 6; 15 in all;
//   57 in all.
TEST(Plan, InvalidLayoutsAreCountedWithTheTrainersReasons) {
  const plan::Plan p = plan::make_plan(tiny_gpt(), plan::Cluster{4, 1, 80}, h100());
  EXPECT_EQ(p.enumerated, 336u);
  EXPECT_EQ(p.valid.size() + p.invalid.size(), p.enumerated);
  int context = 0, batch = 0, interleaved = 0;
  for (const auto& i : p.invalid) {
    context += i.reason.find("context-parallel") != std::string::npos;
    batch += i.reason.find("is not a multiple of micro-batch-size x data-parallel") != std::string::npos;
    interleaved += i.reason.find("--pipeline-schedule interleaved with 1 micro-batches") != std::string::npos;
  }
  EXPECT_EQ(context, 0);
  EXPECT_EQ(batch, 42);
  EXPECT_EQ(interleaved, 15);
  EXPECT_EQ(p.invalid.size(), 57u);
  // The table shows none of the refused ones.
  const std::string table = plan::format_table(p, 1000);
  EXPECT_NE(table.find("336 layouts enumerated"), std::string::npos) << table;
  EXPECT_NE(table.find("refused by the trainers' validation"), std::string::npos) << table;
}

// Every layout the plan shows passes trainer::validate, and every one it refused fails it.
TEST(Plan, EveryShownLayoutPassesTheTrainersValidationAndEveryRefusedOneFails) {
  for (const plan::Cluster cluster : {plan::Cluster{4, 1, 80}, plan::Cluster{2, 2, 80}}) {
    const trainer::TrainArgs model = tiny_gpt();
    const plan::Plan p = plan::make_plan(model, cluster, h100());
    ASSERT_FALSE(p.valid.empty());
    ASSERT_FALSE(p.invalid.empty());
    for (const auto& c : p.valid) EXPECT_NO_THROW(trainer::validate(plan::args_of(model, cluster, c.layout))) << plan::describe_layout(c.layout);
    for (const auto& i : p.invalid)
      EXPECT_THROW(trainer::validate(plan::args_of(model, cluster, i.layout)), strata::ConfigError) << plan::describe_layout(i.layout);
  }
  // A Mixtral-shaped model: ep must divide the experts; full recompute is a valid choice with experts.
  const trainer::TrainArgs moe = trainer::parse_flags(
      "gpt", {"--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "64", "--global-batch-size", "8",
              "--position-embedding-type", "rope", "--normalization", "RMSNorm", "--swiglu", "--untie-embeddings-and-output-weights",
              "--disable-bias-linear", "--num-experts", "4", "--moe-router-topk", "2", "--vocab-size", "257"});
  const plan::Plan p = plan::make_plan(moe, plan::Cluster{4, 1, 80}, h100());
  ASSERT_FALSE(p.valid.empty());
  bool full = false;
  for (const auto& c : p.valid) {
    full = full || c.layout.recompute == RecomputeGranularity::full;
    EXPECT_NO_THROW(trainer::validate(plan::args_of(moe, p.cluster, c.layout)));
  }
  EXPECT_TRUE(full) << "no valid layout of the MoE model recomputes fully";
  // Selective recompute of the MoE blocks too (--recompute-modules core_attn moe) is a choice for a
  // MoE model: it keeps less than selective alone and repeats more of the forward.
  int with_moe = 0;
  for (const auto& c : p.valid) {
    if (!c.layout.recompute_moe) continue;
    ++with_moe;
    EXPECT_EQ(c.layout.recompute, RecomputeGranularity::selective);
    const trainer::TrainArgs a = plan::args_of(moe, p.cluster, c.layout);
    EXPECT_EQ(a.recompute_modules, "core_attn moe");
    plan::Layout selective = c.layout;
    selective.recompute_moe = false;
    const trainer::TrainArgs b = plan::args_of(moe, p.cluster, selective);
    EXPECT_LT(c.memory.per_gpu(), plan::predict_memory(b, h100(), RecomputeGranularity::selective).per_gpu()) << plan::describe_layout(c.layout);
    EXPECT_GT(c.time.recompute, plan::predict_step(b, selective, p.cluster, h100()).recompute) << plan::describe_layout(c.layout);
    EXPECT_NE(plan::describe_layout(c.layout).find("recompute=selective+moe"), std::string::npos);
  }
  EXPECT_GT(with_moe, 0) << "no valid layout of the MoE model recomputes its MoE blocks";
  for (const auto& c : plan::make_plan(tiny_gpt(), plan::Cluster{4, 1, 80}, h100()).valid) EXPECT_FALSE(c.layout.recompute_moe);
  for (const auto& i : p.invalid) EXPECT_THROW(trainer::validate(plan::args_of(moe, p.cluster, i.layout)), strata::ConfigError);
}

// The trainers' start-up estimate (plan_memory, which the CUDA trainers compare with the GPU's free
// memory and the CPU trainers with the host's) counts the run's recompute: each of selective
// (core_attn), moe_act, moe and full keeps less than no recompute, full least, and the parameters,
// gradients and optimizer state do not move.
TEST(Plan, TrainersEstimateCountsTheRunsRecompute) {
  const std::vector<std::string> model = {
      "--num-layers", "4", "--hidden-size", "256", "--num-attention-heads", "8", "--seq-length", "512", "--ffn-hidden-size", "512",
      "--micro-batch-size", "4", "--global-batch-size", "4", "--position-embedding-type", "rope", "--normalization", "RMSNorm",
      "--swiglu", "--untie-embeddings-and-output-weights", "--disable-bias-linear", "--num-experts", "4", "--moe-router-topk", "2",
      "--vocab-size", "257"};
  const trainer::MemoryPlan kept = trainer::plan_memory<strata::bf16>(trainer::parse_flags("gpt", model));
  auto activations = [&](const char* granularity, const char* modules) {
    std::vector<std::string> flags = model;
    if (*granularity) flags.insert(flags.end(), {"--recompute-granularity", granularity});
    if (*modules) flags.insert(flags.end(), {"--recompute-modules", modules});
    const trainer::MemoryPlan plan = trainer::plan_memory<strata::bf16>(trainer::parse_flags("gpt", flags));
    EXPECT_EQ(plan.per_rank.parameter_bytes + plan.per_rank.gradient_bytes + plan.per_rank.optimizer_bytes,
              kept.per_rank.parameter_bytes + kept.per_rank.gradient_bytes + kept.per_rank.optimizer_bytes);
    return plan.per_rank.activation_bytes;
  };
  const std::int64_t none = activations("", "");
  const std::int64_t core = activations("selective", "core_attn"), act = activations("selective", "moe_act");
  const std::int64_t block = activations("selective", "moe"), full = activations("full", "");
  std::printf("activations: none %lld, core_attn %lld, moe_act %lld, moe %lld, full %lld\n", static_cast<long long>(none),
              static_cast<long long>(core), static_cast<long long>(act), static_cast<long long>(block), static_cast<long long>(full));
  EXPECT_LT(core, none);
  EXPECT_LT(act, none);
  EXPECT_LT(block, act);
  EXPECT_LT(full, block);
}

// The memory the plan predicts is plan_memory's (the trainers' start-up estimate) exactly, for every
// pipeline rank's largest, recompute included; recompute changes only the activations, and never adds
// more than one layer's backward beside what it keeps.
TEST(Plan, MemoryEqualsTheTrainersPlanMemory) {
  const trainer::TrainArgs model = tiny_gpt();
  const plan::Cluster cluster{4, 1, 80};
  const plan::Calibration calibration = h100();
  const plan::Plan p = plan::make_plan(model, cluster, calibration);
  int checked = 0;
  for (const auto& c : p.valid) {
    const trainer::TrainArgs a = plan::args_of(model, cluster, c.layout);
    const trainer::MemoryPlan memory = trainer::plan_memory<strata::bf16>(a);
    EXPECT_EQ(c.memory.estimate, memory.per_rank.total()) << plan::describe_layout(c.layout);
    EXPECT_EQ(c.memory.stage, memory.per_rank_stage) << plan::describe_layout(c.layout);
    if (c.layout.recompute != RecomputeGranularity::none) {
      trainer::TrainArgs kept = a;
      kept.recompute_granularity.clear();
      const trainer::MemoryPlan without = trainer::plan_memory<strata::bf16>(kept);
      EXPECT_EQ(memory.per_rank.parameter_bytes, without.per_rank.parameter_bytes) << plan::describe_layout(c.layout);
      EXPECT_LE(memory.per_rank.total(), without.per_rank.total() + without.per_rank.activation_bytes) << plan::describe_layout(c.layout);
    }
    EXPECT_EQ(c.memory.per_gpu(), c.memory.estimate +
                                      static_cast<std::int64_t>(calibration.runtime_reserve_gib * 1024.0 * 1024.0 * 1024.0));
    ++checked;
  }
  EXPECT_GT(checked, 100);
}

// The picture: one point per valid layout, a line at the GPU's memory, the best ringed; well formed
// enough that every element opened is closed.
TEST(Plan, SvgHasOnePointPerValidLayout) {
  const plan::Plan p = plan::make_plan(tiny_gpt(), plan::Cluster{4, 1, 80}, h100());
  const std::string svg = plan::svg(p, "tiny <GPT> & co");
  auto count = [&](const std::string& what) {
    std::size_t n = 0;
    for (std::size_t at = svg.find(what); at != std::string::npos; at = svg.find(what, at + 1)) ++n;
    return n;
  };
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  EXPECT_EQ(count("<circle"), p.valid.size() + 1);  // the points and the ring around the best
  EXPECT_EQ(count("<circle"), count("</circle>") + 1);  // the ring closes itself
  EXPECT_EQ(count("<text"), count("</text>"));
  EXPECT_EQ(svg.find("<GPT>"), std::string::npos);  // the title is escaped
  EXPECT_NE(svg.find("80 GiB per GPU"), std::string::npos);
}

// A calibration file is checked field by field, its errors name the file and the field.
TEST(Plan, CalibrationFileErrorsNameTheFileAndTheField) {
  const std::string good = plan::calibration_json(h100());
  EXPECT_NO_THROW(plan::parse_calibration(good, "good.json"));
  auto message = [](const std::string& text) {
    try {
      plan::parse_calibration(text, "cal.json");
    } catch (const strata::ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  auto replaced = [&](const std::string& from, const std::string& to) {
    std::string text = good;
    const auto at = text.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return text.replace(at, from.size(), to);
  };
  EXPECT_NE(message("{").find("cal.json: not valid JSON"), std::string::npos) << message("{");
  EXPECT_NE(message("[]").find("not an object"), std::string::npos);
  const std::string missing = message(replaced("\"attention_tflops\"", "\"attention_tflop\""));
  EXPECT_NE(missing.find("unknown field \"attention_tflop\""), std::string::npos) << missing;
  const std::string negative = message(replaced("\"elementwise_gbps\": 2400.0", "\"elementwise_gbps\": -1"));
  EXPECT_NE(negative.find("cal.json"), std::string::npos) << negative;
  EXPECT_NE(negative.find("\"elementwise_gbps\" is -1"), std::string::npos) << negative;
  const std::string text = message(replaced("\"bus_gbps\": 170.0", "\"bus_gbps\": \"fast\""));
  EXPECT_NE(text.find("\"links.nvlink.bus_gbps\" is a string, not a number"), std::string::npos) << text;
  const std::string format = message(replaced("strata-plan-calibration", "something-else"));
  EXPECT_NE(format.find("\"format\""), std::string::npos) << format;
  // FP8 GEMM rates: up to twice peak_tflops (Hopper's dense FP8 peak), written and read back
  const std::string fp8_peak = message(replaced("\"tflops\": 1407.0", "\"tflops\": 1979.0"));
  EXPECT_NE(fp8_peak.find("\"fp8_gemm_tflops[0].tflops\" (1979"), std::string::npos) << fp8_peak;
  EXPECT_EQ(plan::parse_calibration(good, "good.json").fp8_gemm.size(), 11u);
  EXPECT_THROW(plan::load_calibration("/nonexistent/cal.json"), strata::ConfigError);
}

// --calibrate on the CPU: tiny shapes, two threads; the file it writes reads back.
TEST(Plan, CpuCalibrationWritesAFileThatReadsBack) {
  plan::CalibrateOptions o;
  o.sizes = {16, 32};
  o.elementwise_elements = 1 << 16;
  o.collective_bytes = {1 << 10, 1 << 16};
  o.seconds_per_measurement = 0.001;
  const plan::Calibration c = plan::calibrate_cpu(o);
  EXPECT_EQ(c.gemm.size(), 8u);
  const plan::Calibration back = plan::parse_calibration(plan::calibration_json(c), "cpu.json");
  EXPECT_EQ(back.gemm.size(), 8u);
  EXPECT_GT(back.nvlink.bus_gbps, 0);
  EXPECT_GT(back.attention_tflops, 0);
}

// ---- prediction against the runs of bench/RESULTS.md ---------------------------------------------

struct Measured {
  const char* name;
  const char* source;  // the RESULTS.md entry and its GPU
  std::vector<std::string> flags;
  plan::Cluster cluster;
  plan::Layout layout;
  double tokens_per_second;
  double peak_gib;  // the caching allocator's peak in use on rank 0
};

std::vector<std::string> gpt(int layers, int hidden, int heads, int seq, int batch) {
  return {"--num-layers", std::to_string(layers), "--hidden-size", std::to_string(hidden), "--num-attention-heads", std::to_string(heads),
          "--seq-length", std::to_string(seq), "--global-batch-size", std::to_string(batch), "--vocab-size", "50304"};
}
std::vector<std::string> llama3b(int batch) {
  return {"--num-layers", "28", "--hidden-size", "3072", "--num-attention-heads", "24", "--group-query-attention", "--num-query-groups", "8",
          "--ffn-hidden-size", "8192", "--seq-length", "4096", "--global-batch-size", std::to_string(batch), "--vocab-size", "32000",
          "--position-embedding-type", "rope", "--normalization", "RMSNorm", "--swiglu", "--untie-embeddings-and-output-weights",
          "--disable-bias-linear"};
}
std::vector<std::string> mixtral_small() {
  return {"--num-layers", "8", "--hidden-size", "1024", "--num-attention-heads", "16", "--group-query-attention", "--num-query-groups", "8",
          "--ffn-hidden-size", "3584", "--seq-length", "1024", "--global-batch-size", "8", "--vocab-size", "50304",
          "--position-embedding-type", "rope", "--normalization", "RMSNorm", "--swiglu", "--untie-embeddings-and-output-weights",
          "--disable-bias-linear", "--num-experts", "8", "--moe-router-topk", "2"};
}
plan::Layout layout(int tp, int pp, int dp, int mb, std::string schedule = "1f1b", int v = 1,
                    RecomputeGranularity r = RecomputeGranularity::none, bool distributed = false) {
  plan::Layout l;
  l.tp = tp, l.pp = pp, l.dp = dp, l.micro_batch = mb, l.schedule = schedule, l.virtual_stages = v, l.recompute = r;
  l.distributed_optimizer = distributed;
  return l;
}

std::vector<Measured> measured_runs() {
  const plan::Cluster one{1, 1, 80}, two{2, 1, 141}, four{4, 1, 141}, one_h200{1, 1, 141};
  using R = RecomputeGranularity;
  return {
      {"GPT-2 124M, 1 GPU, mbs 32", "2026-11-23 bf16 beside PyTorch, H100", gpt(12, 768, 12, 1024, 32), one, layout(1, 1, 1, 32), 521509, 12.53},
      {"GPT-2 350M, 1 GPU, mbs 16", "2026-11-23 bf16 beside PyTorch, H100", gpt(24, 1024, 16, 1024, 16), one, layout(1, 1, 1, 16), 192302, 18.83},
      {"GPT 405M, 1 GPU, mbs 16", "2026-11-22 data parallelism at scale, H200", gpt(24, 1024, 16, 1024, 16), one_h200, layout(1, 1, 1, 16),
       202340, 18.83},
      {"GPT 405M, dp=2, mbs 16", "2026-11-22, H200", gpt(24, 1024, 16, 1024, 32), two, layout(1, 1, 2, 16), 378906, 18.83},
      {"GPT 405M, dp=2 dist-opt, mbs 16", "2026-11-22, H200", gpt(24, 1024, 16, 1024, 32), two, layout(1, 1, 2, 16, "1f1b", 1, R::none, true),
       391623, 16.85},
      {"GPT 405M, dp=4 dist-opt, mbs 16", "2026-11-22, H200", gpt(24, 1024, 16, 1024, 64), four,
       layout(1, 1, 4, 16, "1f1b", 1, R::none, true), 786212, 15.86},
      {"GPT 405M, selective recompute", "2026-11-22, H200", gpt(24, 1024, 16, 1024, 16), one_h200,
       layout(1, 1, 1, 16, "1f1b", 1, R::selective), 196621, 18.06},
      {"GPT 405M, full recompute", "2026-11-22, H200", gpt(24, 1024, 16, 1024, 16), one_h200, layout(1, 1, 1, 16, "1f1b", 1, R::full), 159795,
       7.99},
      {"GPT 1.41B, 1 GPU, mbs 8", "2026-11-24 tp=2 with and without overlap, H200", gpt(24, 2048, 16, 1024, 8), one_h200, layout(1, 1, 1, 8),
       63138, 34.64},
      {"GPT 1.41B, 1 GPU, mbs 16", "2026-11-24 copy engines, H200", gpt(24, 2048, 16, 1024, 16), one_h200, layout(1, 1, 1, 16), 65470, 47.12},
      {"GPT 1.41B, tp=2 + SP, mbs 8", "2026-11-24, H200", gpt(24, 2048, 16, 1024, 8), two, layout(2, 1, 1, 8), 97840, 18.28},
      {"GPT 1.41B, tp=2 + SP, mbs 16", "2026-11-24, H200", gpt(24, 2048, 16, 1024, 16), two, layout(2, 1, 1, 16), 106606, 25.28},
      {"Llama 3B, tp=2 pp=2 1f1b", "2026-11-22, 4 H200", llama3b(16), four, layout(2, 2, 1, 1), 77358, 18.69},
      {"Llama 3B, tp=2 pp=2 interleaved v=2", "2026-11-22, 4 H200", llama3b(16), four, layout(2, 2, 1, 1, "interleaved", 2), 79106, 20.07},
      {"Llama 3B, tp=2 pp=2 zero-bubble", "2026-11-22, 4 H200", llama3b(16), four, layout(2, 2, 1, 1, "zero-bubble"), 78305, 20.45},
      {"Llama 3B, tp=1 pp=2 1f1b", "2026-11-23, 2 H200", llama3b(16), two, layout(1, 2, 1, 1), 47268, 35.97},
      {"Llama 3B, tp=1 pp=2 interleaved v=2", "2026-11-23, 2 H200", llama3b(16), two, layout(1, 2, 1, 1, "interleaved", 2), 47707, 38.40},
      {"Llama 3B, tp=1 pp=2 zero-bubble", "2026-11-23, 2 H200", llama3b(16), two, layout(1, 2, 1, 1, "zero-bubble"), 48117, 38.75},
  };
}

// A run's flags parsed as the trainers parse them, the model's vocabulary the tokenizer's (as the
// trainers set it before building the model).
trainer::TrainArgs model_of(const std::vector<std::string>& flags) {
  trainer::TrainArgs model = trainer::parse_flags("gpt", flags);
  model.model.vocab_size = static_cast<int>(model.tokenizer.vocab_size);
  return model;
}

struct Comparison {
  const Measured* run;
  double predicted_tokens_per_second, predicted_gib;
  double time_error() const { return run->tokens_per_second / predicted_tokens_per_second - 1; }  // predicted step time vs measured
  double memory_error() const { return predicted_gib / run->peak_gib - 1; }
};

std::vector<Comparison> compare(const std::vector<Measured>& runs, const plan::Calibration& calibration = h100()) {
  std::vector<Comparison> out;
  for (const Measured& run : runs) {
    trainer::TrainArgs model = model_of(run.flags);
    const trainer::TrainArgs a = plan::args_of(model, run.cluster, run.layout);
    trainer::validate(a);
    const plan::MemoryPrediction memory = plan::predict_memory(a, calibration, run.layout.recompute);
    const plan::StepTime time = plan::predict_step(a, run.layout, run.cluster, calibration);
    const double tokens = double(model.global_batch_size) * model.model.seq_length / (time.total() * 1e-3);
    // The allocator's peak counts what the estimate counts, not the runtime reserve (CUDA context).
    out.push_back({&run, tokens, double(memory.estimate) / (1 << 30)});
  }
  return out;
}

void print(const std::vector<Comparison>& rows) {
  std::printf("%-44s %12s %12s %8s %9s %9s %8s\n", "run", "tokens/s", "predicted", "time err", "GiB", "predicted", "mem err");
  for (const Comparison& c : rows)
    std::printf("%-44s %12.0f %12.0f %+7.1f%% %9.2f %9.2f %+7.1f%%\n", c.run->name, c.run->tokens_per_second, c.predicted_tokens_per_second,
                100 * c.time_error(), c.run->peak_gib, c.predicted_gib, 100 * c.memory_error());
}

bool is(const Measured& run, const char* word) { return std::string(run.name).find(word) != std::string::npos; }

// FP8 (delayed, per-tensor codes kept) on one H100, GPT 1.41B, micro-batch 8 (bench/RESULTS.md,
// 2026-12-06, commit 335f456, one script): the allocator's peak 35.04 GiB against 34.63 in bf16. The
// estimate counts each FP8 layer's weight cache (2 bytes per weight: +2.25 GiB) and the one-byte
// codes of the linear inputs kept in place of bf16 tensors (-1.88 GiB): the FP8 run's memory within
// 5%, and its change from bf16 within 0.1 GiB of the measured +0.41 GiB. That run kept both layouts
// (--fp8-weight-cache both, as every run did then); its one micro-batch a step now keeps W^T alone
// (auto): 1 byte per FP8 weight less, less the largest weight's transient forward codes, estimated
// 33.63 GiB (below bf16's 34.37); measured 33.92 GiB (bench/RESULTS.md, 2026-12-06, commit 4705bf5).
TEST(Plan, Fp8MemoryCountsWeightCachesAndKeptCodes) {
  const plan::Cluster one{1, 1, 80};
  std::vector<std::string> flags = gpt(24, 2048, 16, 1024, 8);
  Measured bf16_run{"GPT 1.41B bf16", "2026-12-06 FP8, H100", flags, one, layout(1, 1, 1, 8), 60132, 34.63};
  // (measured with fc2 keeping its input's codes, named whatever the default)
  for (const char* f : {"--fp8-format", "hybrid", "--fp8-recipe", "delayed", "--no-fp8-activation-codes-in-backward"})
    flags.push_back(f);
  std::vector<std::string> transposed = flags;
  for (const char* f : {"--fp8-weight-cache", "both"}) flags.push_back(f);
  Measured fp8_run{"GPT 1.41B FP8 delayed", "2026-12-06 FP8, H100", flags, one, layout(1, 1, 1, 8), 72202, 35.04};
  const std::vector<Measured> runs{bf16_run, fp8_run};  // compare() keeps pointers to them
  const auto rows = compare(runs);
  print(rows);
  EXPECT_LE(std::abs(rows[1].memory_error()), 0.05);
  const double predicted_change = rows[1].predicted_gib - rows[0].predicted_gib, measured_change = 35.04 - 34.63;
  std::printf("FP8 - bf16: predicted %+.3f GiB, measured %+.3f GiB\n", predicted_change, measured_change);
  EXPECT_NEAR(predicted_change, measured_change, 0.1);
  const std::vector<Measured> auto_runs{
      {"GPT 1.41B FP8 delayed, W^T cached", "2026-12-06 FP8, H100", transposed, one, layout(1, 1, 1, 8), 79166, 33.92}};
  const auto auto_rows = compare(auto_runs);
  print(auto_rows);
  EXPECT_LE(std::abs(auto_rows[0].memory_error()), 0.05);
  const double weights = 24.0 * 12 * 2048 * 2048, largest = 4.0 * 2048 * 2048;  // the FP8 weights; fc1's
  EXPECT_NEAR(rows[1].predicted_gib - auto_rows[0].predicted_gib, (weights - largest) / double(1 << 30), 1e-6);
  EXPECT_LT(auto_rows[0].predicted_gib, rows[0].predicted_gib) << "below bf16's";
  // --fp8-recast-attention-output: the output projections hold no codes of their input (the
  // attention's output, 16 heads x 128 a token) in the 24 layers' kept activations.
  std::vector<std::string> recast = transposed;
  recast.push_back("--fp8-recast-attention-output");
  const std::vector<Measured> recast_runs{{"GPT 1.41B FP8 delayed, recast", "(predicted only)", recast, one, layout(1, 1, 1, 8), 1, 1}};
  const auto recast_rows = compare(recast_runs);
  EXPECT_NEAR(auto_rows[0].predicted_gib - recast_rows[0].predicted_gib, 24.0 * 8192 * 2048 / double(1 << 30), 1e-6);
  // fc2's input codes made in fc1's backward (--fp8-activation-codes-in-backward): the 24 layers keep
  // no codes of the GELU's output (8192 a token), one layer's exist in the backward.
  std::vector<std::string> later = transposed;
  later.back() = "--fp8-activation-codes-in-backward";  // in place of --no-...
  const std::vector<Measured> later_runs{{"GPT 1.41B FP8 delayed, codes in the backward", "(predicted only)", later, one,
                                          layout(1, 1, 1, 8), 1, 1}};
  const auto later_rows = compare(later_runs);
  print(later_rows);
  EXPECT_NEAR(auto_rows[0].predicted_gib - later_rows[0].predicted_gib, 24.0 * 8192 * 8192 / double(1 << 30),
              8192.0 * 8192 / double(1 << 30));
}

// The four one-H100 runs the FP8 pricing tests compare (bench/RESULTS.md, 2026-12-06): GPT 1.41B at
// micro-batch 8 and the Llama of 3.0B at seq 4096, micro-batch 2, each in bf16 and FP8 delayed, with
// the tokens/s of the session named by `when` (the memory figures are every session's).
std::vector<Measured> gpt_and_llama_fp8_runs(const char* when, double gpt_bf16, double gpt_fp8, double llama_bf16,
                                             double llama_fp8) {
  const plan::Cluster one{1, 1, 80};
  auto with_fp8 = [](std::vector<std::string> flags) {  // (measured with fc2 keeping its input's codes, named)
    flags.insert(flags.end(), {"--fp8-format", "hybrid", "--fp8-recipe", "delayed", "--no-fp8-activation-codes-in-backward"});
    return flags;
  };
  return {{"GPT 1.41B bf16", when, gpt(24, 2048, 16, 1024, 8), one, layout(1, 1, 1, 8), gpt_bf16, 34.63},
          {"GPT 1.41B FP8 delayed", when, with_fp8(gpt(24, 2048, 16, 1024, 8)), one, layout(1, 1, 1, 8), gpt_fp8, 33.92},
          {"Llama 3.0B seq 4096 bf16", when, llama3b(2), one, layout(1, 1, 1, 2), llama_bf16, 71.99},
          {"Llama 3.0B seq 4096 FP8 delayed", when, with_fp8(llama3b(2)), one, layout(1, 1, 1, 2), llama_fp8, 72.26}};
}
// FP8 over bf16 of each model of gpt_and_llama_fp8_runs, {measured, predicted}, printed.
std::vector<std::pair<double, double>> fp8_speedups(const std::vector<Measured>& runs, const std::vector<Comparison>& rows) {
  std::vector<std::pair<double, double>> out;
  for (std::size_t i : {0u, 2u}) {
    const double measured = runs[i + 1].tokens_per_second / runs[i].tokens_per_second,
                 predicted = rows[i + 1].predicted_tokens_per_second / rows[i].predicted_tokens_per_second;
    std::printf("%s: FP8 / bf16 measured %.3fx, predicted %.3fx\n", runs[i].name, measured, predicted);
    out.emplace_back(measured, predicted);
  }
  return out;
}

// FP8 step times (per-tensor recipes): the FP8 layers' GEMMs at the calibration's fp8_gemm_tflops
// (bench/calibration/h100_node.json: the FP8 GEMMs a --gemm-tuning run of the Llama timed) and their
// casts. Measured on one H100 (bench/RESULTS.md, 2026-12-06): GPT 1.41B at micro-batch 8, bf16
// 62,402 and FP8 delayed 79,408 tokens/s (commit 597d6d2, one script); the Llama of 3.0B at seq 4096,
// micro-batch 2, bf16 25,391 and FP8 33,594 (6fe93da, one script). The speedup FP8 brings is
// predicted within 10% for both, GPT's FP8 step within 15% and its memory within 5%. The Llama's steps
// come out 15-25% slow in bf16 and FP8 alike: the one attention rate (measured at sequence 1024) is
// about half of what cuDNN reaches at 4096 (docs/PLANNING.md); its memory is within 5%.
TEST(Plan, Fp8StepsArePricedAtTheFp8GemmRates) {
  const std::vector<Measured> runs = gpt_and_llama_fp8_runs("2026-12-06, H100", 62402, 79408, 25391, 33594);
  const auto rows = compare(runs);
  print(rows);
  for (const Comparison& c : rows) EXPECT_LE(std::abs(c.memory_error()), 0.05) << c.run->name;
  for (const auto& [measured, predicted] : fp8_speedups(runs, rows)) {
    EXPECT_GT(predicted, 1.1);
    EXPECT_LE(std::abs(predicted / measured - 1), 0.10);
  }
  EXPECT_LE(std::abs(rows[1].time_error()), 0.15) << "GPT 1.41B FP8";
  for (std::size_t i : {2u, 3u}) {  // the Llama at seq 4096: slow, by the attention rate
    EXPECT_GT(rows[i].time_error(), 0.10) << runs[i].name;
    EXPECT_LT(rows[i].time_error(), 0.30) << runs[i].name;
  }
  // Without FP8 rates in the calibration the FP8 GEMMs are priced at bf16's: slower than with them.
  plan::Calibration bf16_rates = h100();
  bf16_rates.fp8_gemm.clear();
  const std::vector<Measured> gpt_fp8{runs[1]};  // compare() keeps pointers to them
  const auto without = compare(gpt_fp8, bf16_rates);
  EXPECT_LT(without[0].predicted_tokens_per_second, rows[1].predicted_tokens_per_second);
}

// The H100's own calibration (bench/calibration/h100_measured.json, `strata-plan --calibrate` on the
// machine of the runs below, 2026-12-06): GPT 1.41B and the Llama of 3.0B at seq 4096 in bf16 and FP8
// delayed, one H100, measured in the same session (bench/RESULTS.md). Memory within 5%, step time
// within 15% (the Llama, 18-22% slow with h100_node.json's one attention rate, comes within 2% with
// the rates by length and backward), the FP8 speedup over bf16 within 10% of the measured one.
TEST(Plan, MeasuredH100CalibrationPricesTheOneGpuRuns) {
  const std::vector<Measured> runs =
      gpt_and_llama_fp8_runs("2026-12-06, H100, h100_measured.json", 63263, 79945, 25631, 34043);
  const auto rows = compare(runs, h100_measured());
  print(rows);
  for (const Comparison& c : rows) {
    EXPECT_LE(std::abs(c.memory_error()), 0.05) << c.run->name;
    EXPECT_LE(std::abs(c.time_error()), 0.15) << c.run->name;
  }
  for (const auto& [measured, predicted] : fp8_speedups(runs, rows)) EXPECT_LE(std::abs(predicted / measured - 1), 0.10);
}

// --fp8-param-gather: the distributed optimizer's all-gather moves the FP8 layers' weights as one-byte
// codes and each rank casts its shard of them, so over dp 2 both the exposed data-parallel time and
// the compute (the weight casts) cost less than without the flag; a layout without the distributed
// optimizer is refused with the trainers' sentence.
TEST(Plan, Fp8ParameterGatherMovesCodes) {
  std::vector<std::string> flags = gpt(24, 2048, 16, 1024, 8);
  for (const char* f : {"--fp8-format", "hybrid", "--fp8-recipe", "delayed"}) flags.push_back(f);
  const trainer::TrainArgs plain = trainer::parse_flags("gpt", flags);
  flags.push_back("--fp8-param-gather");
  const trainer::TrainArgs gathered = trainer::parse_flags("gpt", flags);
  const plan::Calibration calibration = h100();
  const plan::Cluster two{2, 1, 80};
  const plan::Layout sharded = layout(1, 1, 2, 4, "1f1b", 1, RecomputeGranularity::none, /*distributed=*/true);
  auto step = [&](const trainer::TrainArgs& model) {
    const trainer::TrainArgs a = plan::args_of(model, two, sharded);
    trainer::validate(a);
    return plan::predict_step(a, sharded, two, calibration);
  };
  const plan::StepTime values = step(plain), codes = step(gathered);
  EXPECT_GT(values.data_parallel, 0.0);
  EXPECT_LT(codes.data_parallel, values.data_parallel);
  EXPECT_LT(codes.compute, values.compute);
  EXPECT_EQ(codes.tensor_parallel, values.tensor_parallel);
  const trainer::TrainArgs replicated = plan::args_of(gathered, two, layout(1, 1, 2, 4));
  try {
    trainer::validate(replicated);
    ADD_FAILURE() << "--fp8-param-gather without the distributed optimizer was not refused";
  } catch (const strata::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("--use-distributed-optimizer"), std::string::npos) << e.what();
  }
}

// Every run but those of the two tests below: predicted step time within 15% and memory within 5%
// of the measured (the tp=2 micro-batch 8 run is the one the NVLink figure of the calibration was
// derived from; bench/calibration/README.md), except two GPT runs short in memory by 5-10%. The
// estimate counts the tensors each layer keeps (the CPU twin's measured peak agrees within 3%,
// tests/models/test_recompute.cpp); the GPT runs on the GPU hold about 32 KiB per token more at
// their peak (1.0 GiB at 32K tokens, 0.5 at 16K, 0.27 at 8K, whatever the depth or width; the Llama
// runs do not), not explained yet: GPT-2 124M at micro-batch 32 (-8%) and the 405M under full
// recompute (-6%, its kept activations the smallest) fall below 5% and assert that shortfall.
TEST(Plan, PredictionsMatchTheRunsOfBenchResults) {
  std::vector<Measured> runs;
  for (const Measured& run : measured_runs())
    if (!is(run, "zero-bubble") && !is(run, "Mixtral")) runs.push_back(run);
  const auto rows = compare(runs);
  print(rows);
  ASSERT_EQ(rows.size(), 16u);
  for (const Comparison& c : rows) {
    EXPECT_LE(std::abs(c.time_error()), 0.15) << c.run->name << " (" << c.run->source << ")";
    if (is(*c.run, "124M") || is(*c.run, "full recompute")) {  // the known shortfall (above)
      EXPECT_LT(c.memory_error(), -0.05) << c.run->name;
      EXPECT_GT(c.memory_error(), -0.10) << c.run->name;
    } else {
      EXPECT_LE(std::abs(c.memory_error()), 0.05) << c.run->name << " (" << c.run->source << ")";
    }
  }
}

// Zero-bubble: step time within 15%, and memory within 5% now that the estimate counts the output
// gradients of every linear layer the micro-batch between its input half and its weight half holds
// (without them it fell 5-10% short: tp=1 pp=2 36.8 against 38.75 GiB, tp=2 pp=2 18.4 against 20.45).
TEST(Plan, ZeroBubbleMemoryCountsTheDeferredWeightGradients) {
  std::vector<Measured> runs;
  for (const Measured& run : measured_runs())
    if (is(run, "zero-bubble")) runs.push_back(run);
  const auto rows = compare(runs);
  print(rows);
  ASSERT_EQ(rows.size(), 2u);
  for (const Comparison& c : rows) {
    EXPECT_LE(std::abs(c.time_error()), 0.15) << c.run->name;
    EXPECT_LE(std::abs(c.memory_error()), 0.05) << c.run->name;
  }
}

// The deferred output gradients, by hand for the 3B Llama's stage of 14 layers (h 3072, 24 heads in
// 8 groups of d 128, SwiGLU 8192, seq 4096, micro-batch 1, bf16): per layer and token (24 + 16) x 128
// / tp + 3072 + 2 x 8192 / tp + 3072, under zero-bubble only.
TEST(Plan, DeferredWeightGradientBytesByHand) {
  const trainer::TrainArgs a = trainer::parse_flags("gpt", llama3b(16));
  const strata::models::ModelPiece stage{14, true, false};
  for (int tp : {1, 2}) {
    const std::int64_t per_token = (24 + 16) * 128 / tp + 3072 + 2 * 8192 / tp + 3072;
    EXPECT_EQ(strata::models::deferred_weight_gradient_bytes(a.model, strata::models::DecoderShape::llama(), tp, 1, {2, 4}, stage),
              per_token * 14 * 4096 * 2);
  }
  plan::Layout zb = layout(1, 2, 1, 1, "zero-bubble"), one_f_one_b = layout(1, 2, 1, 1);
  const plan::Cluster two{2, 1, 141};
  trainer::TrainArgs with_zb = plan::args_of(a, two, zb), with_1f1b = plan::args_of(a, two, one_f_one_b);
  const trainer::MemoryPlan zb_plan = trainer::plan_memory<strata::bf16>(with_zb), plain = trainer::plan_memory<strata::bf16>(with_1f1b);
  EXPECT_EQ(zb_plan.stage_estimates[0].activation_bytes - plain.stage_estimates[0].activation_bytes,
            std::int64_t{(24 + 16) * 128 + 3072 + 2 * 8192 + 3072} * 14 * 4096 * 2);
}

// The Mixtral-shaped runs of tests/gpu/run_moe_gpus.sh as train_mixtral ran them: 8 layers, hidden
// 1024, 16 heads in 8 groups, 8 experts of width 3584, top-2, seq 1024, micro-batch 8 per GPU, the
// all-to-all dispatcher, aux loss 1e-2, no tokenizer given (the byte tokenizer's 257 ids), the global
// batch micro-batch x dp; `padded`: capacity factor 1 with every expert padded to its capacity.
std::vector<std::string> mixtral_as_run(int gpus, bool padded) {
  std::vector<std::string> flags = {"--num-layers", "8", "--hidden-size", "1024", "--num-attention-heads", "16", "--group-query-attention",
                                    "--num-query-groups", "8", "--seq-length", "1024", "--global-batch-size", std::to_string(8 * gpus),
                                    "--vocab-size", "257", "--position-embedding-type", "rope", "--normalization", "RMSNorm", "--swiglu",
                                    "--untie-embeddings-and-output-weights", "--disable-bias-linear", "--num-experts", "8",
                                    "--moe-router-topk", "2", "--ffn-hidden-size", "3584", "--moe-aux-loss-coeff", "1e-2",
                                    "--moe-token-dispatcher-type", "alltoall"};
  if (padded) flags.insert(flags.end(), {"--moe-expert-capacity-factor", "1.0", "--moe-pad-expert-input-to-capacity"});
  return flags;
}
// The dense Llama of the same active parameters (MLP width 7168) beside them.
std::vector<std::string> mixtral_dense_twin() {
  std::vector<std::string> flags = mixtral_as_run(1, false);
  flags.erase(flags.end() - 10, flags.end());  // the experts' flags
  flags.insert(flags.end(), {"--ffn-hidden-size", "7168"});
  return flags;
}
std::vector<Measured> moe_runs() {
  const plan::Cluster one{1, 1, 141}, two{2, 1, 141};
  plan::Layout ep2 = layout(1, 1, 2, 8);
  ep2.ep = 2;
  const char* suite = "2026-11-29 expert parallelism 2 and the fixed-size exchange, H200";
  return {
      {"Mixtral, 1 GPU, counted (1cb0691)", "2026-11-29 the MoE step without host waits, H200", mixtral_as_run(1, false), one,
       layout(1, 1, 1, 8), 230639, 17.04},
      {"Mixtral, 1 GPU, counted", suite, mixtral_as_run(1, false), one, layout(1, 1, 1, 8), 228119, 17.04},
      {"Mixtral, ep=2, counted", suite, mixtral_as_run(2, false), two, ep2, 353692, 12.63},
      {"Mixtral, 1 GPU, padded", suite, mixtral_as_run(1, true), one, layout(1, 1, 1, 8), 157935, 17.04},
      {"Mixtral, ep=2, padded", suite, mixtral_as_run(2, true), two, ep2, 313604, 11.11},
      {"Llama dense twin (MLP 7168), 1 GPU", suite, mixtral_dense_twin(), one, layout(1, 1, 1, 8), 317669, 7.57},
  };
}

// The Mixtral-shaped runs on one and two H200 (bench/RESULTS.md, 2026-11-29), predicted with the
// H100 file as the other H200 runs. A MoE layer keeps the router's input and logits, the routing's
// choices, slots and weights, and per dispatched row its input, fc1's output, the activation and the
// experts' output (the dispatcher keeps it for combine's backward); the most one layer's backward
// holds comes on top. (This test once ran the model with a 50304-token vocabulary the runs did not
// have, 102M parameters of embedding and output layer too many, and found the estimate 7% over; with
// the runs' 257 ids it was 4% under, missing the dispatcher's copy and the backward.)
//   Memory within 5% except the counted exchange at ep=2: there the rows a rank receives follow the
//   router's choices (random tokens, a young router), the estimate counts their mean (tokens x top-2)
//   and the run's peak is its most loaded step; one GPU holds the upper bound T x k whatever the
//   choices, padding holds the capacity: both within 5%. Asserted as the known shortfall.
//   Step time within 15% for the counted runs: on one GPU the experts' GEMMs read the counts on the
//   device and the host never waits; at ep=2 the host reads them once per layer
//   (moe_host_ms_per_layer, derived from this ep=2 run, so it is no independent check). Padded to
//   capacity (factor 1: 8 experts x 2048 rows = 16384, as many rows as the counted runs) the runs
//   are 30-45% slower than the counted ones for the same rows and no wait, which the model, pricing
//   rows, does not see: both predicted fast, asserted as the known error.
TEST(Plan, MixtureOfExpertsWithin5And15PercentExceptTheKnownErrors) {
  const std::vector<Measured> runs = moe_runs();
  const auto rows = compare(runs);
  print(rows);
  ASSERT_EQ(rows.size(), 6u);
  for (const Comparison& c : rows) {
    if (is(*c.run, "ep=2, counted")) {
      EXPECT_LT(c.memory_error(), -0.05) << c.run->name;
      EXPECT_GT(c.memory_error(), -0.20) << c.run->name;
    } else {
      EXPECT_LE(std::abs(c.memory_error()), 0.05) << c.run->name;
    }
    if (is(*c.run, "padded")) {
      EXPECT_LT(c.time_error(), -0.15) << c.run->name;  // the run is slower than the model says
      EXPECT_GT(c.time_error(), -0.50) << c.run->name;
    } else {
      EXPECT_LE(std::abs(c.time_error()), 0.15) << c.run->name;
    }
  }
}

// The host waits only where the dispatcher reads the token counts: none on one GPU, once per MoE
// layer and micro-batch at ep=2 with the counted exchange, none at ep=2 padded to capacity.
TEST(Plan, MoeHostWaitsOnlyWhereTheExchangeReadsCountsOnTheHost) {
  const plan::Calibration calibration = h100();
  auto overhead = [&](const Measured& run) {
    trainer::TrainArgs model = model_of(run.flags);
    const trainer::TrainArgs a = plan::args_of(model, run.cluster, run.layout);
    return plan::predict_step(a, run.layout, run.cluster, calibration).overhead - calibration.step_overhead_ms;
  };
  const auto runs = moe_runs();
  EXPECT_EQ(overhead(runs[1]), 0.0);
  EXPECT_NEAR(overhead(runs[2]), 8 * calibration.moe_host_ms_per_layer, 1e-9);  // 8 MoE layers, 1 micro-batch
  EXPECT_EQ(overhead(runs[3]), 0.0);
  EXPECT_EQ(overhead(runs[4]), 0.0);
}

// FP8 experts (the delayed recipe; layers/moe/experts.hpp) on the Mixtral-shaped model, one GPU: the
// experts' GEMMs at the FP8 rates and their casts, and one read of the counts on the host per MoE layer
// (per-expert GEMMs), which the bf16 experts' device-count GEMM does not need; under tensorwise the
// experts stay bf16 and no read is charged. The memory: the experts' weight codes (W^T's at one micro-batch a step),
// less what the dispatched rows keep as codes instead of bf16 (models::Fp8Layers::experts).
TEST(Plan, Fp8ExpertsArePricedUnderTheDelayedRecipeOnly) {
  const plan::Calibration calibration = h100();
  const plan::Cluster one{1, 1, 80};
  auto predict = [&](const char* recipe) {
    std::vector<std::string> flags = mixtral_as_run(1, false);
    flags.insert(flags.end(), {"--fp8-format", "hybrid", "--fp8-recipe", recipe});
    trainer::TrainArgs model = model_of(flags);
    const trainer::TrainArgs a = plan::args_of(model, one, layout(1, 1, 1, 8));
    return std::pair{plan::predict_step(a, layout(1, 1, 1, 8), one, calibration),
                     trainer::plan_memory<strata::bf16>(a).per_rank.total()};
  };
  const auto [delayed, delayed_memory] = predict("delayed");
  const auto [tensorwise, tensorwise_memory] = predict("tensorwise");
  EXPECT_NEAR(delayed.overhead - tensorwise.overhead, 8 * calibration.moe_host_ms_per_layer, 1e-9);  // 8 MoE layers
  EXPECT_LT(delayed.compute, tensorwise.compute) << "the experts' GEMMs at the FP8 rates outweigh their casts";
  const std::int64_t rows = 8 * 1024 * 2, codes = 8 * 3 * 3584 * 1024;  // tokens x topk; 8 experts' weights
  const std::int64_t qkv = (16 + 2 * 8) * 64 * 1024;  // the attention's largest forward codes
  // One micro-batch a step: --fp8-weight-cache auto keeps W^T alone (1 byte per weight), and the
  // experts' forward codes of one projection exist while its GEMMs run, in place of the attention's
  // largest; 1 byte instead of 2 per kept element of the dispatched rows.
  const std::int64_t expected = 8 * (codes - rows * (1024 + 3584)) + (codes - qkv);
  EXPECT_EQ(delayed_memory - tensorwise_memory, expected);
}

// Context parallelism: the Llama of 1.14B (16 layers, hidden 2048, 16 heads in 8 groups, SwiGLU
// 8192, vocab 32000) of bench/cp_bench.sh on 2 H200 (bench/RESULTS.md, 2026-11-29): micro-batch 1 =
// global batch 1, every layer recomputed (one per chunk), --no-deterministic-attention.
std::vector<std::string> cp_llama(int seq, const char* comm) {
  return {"--num-layers", "16", "--hidden-size", "2048", "--num-attention-heads", "16", "--group-query-attention", "--num-query-groups", "8",
          "--ffn-hidden-size", "8192", "--vocab-size", "32000", "--seq-length", std::to_string(seq), "--global-batch-size", "1",
          "--position-embedding-type", "rope", "--normalization", "RMSNorm", "--swiglu", "--untie-embeddings-and-output-weights",
          "--disable-bias-linear", "--cp-comm-type", comm, "--no-deterministic-attention"};
}
std::vector<Measured> cp_runs() {
  using R = RecomputeGranularity;
  const plan::Cluster one{1, 1, 141}, two{2, 1, 141};
  const plan::Layout single = layout(1, 1, 1, 1, "1f1b", 1, R::full);
  plan::Layout cp2 = single, cp2_zero = layout(1, 1, 1, 1, "1f1b", 1, R::full, true);
  cp2.cp = cp2_zero.cp = 2;
  const char* source = "2026-11-29 context parallelism (bench/cp_bench.sh), 2 H200";
  std::vector<Measured> runs;
  struct Row {
    int seq;
    double one_tps, one_gib, p2p_tps, p2p_gib, a2a_tps, a2a_gib, zero_tps, zero_gib;
  };
  for (const Row& r : {Row{16384, 37817, 22.5, 59997, 20.7, 61106, 20.8, 61286, 14.4}, Row{65536, 19608, 32.8, 35642, 25.7, 36005, 26.1, 35766, 19.4},
                       Row{131072, 0, 0, 22352, 32.3, 21839, 33.1, 22334, 26.0}}) {
    const std::string k = std::to_string(r.seq / 1024) + "K, ";
    auto name = [&](const char* what) { return strdup((k + what).c_str()); };
    if (r.one_tps > 0) runs.push_back({name("1 GPU"), source, cp_llama(r.seq, "p2p"), one, single, r.one_tps, r.one_gib});
    runs.push_back({name("cp=2 p2p"), source, cp_llama(r.seq, "p2p"), two, cp2, r.p2p_tps, r.p2p_gib});
    runs.push_back({name("cp=2 a2a"), source, cp_llama(r.seq, "a2a"), two, cp2, r.a2a_tps, r.a2a_gib});
    runs.push_back({name("cp=2 p2p dist-opt"), source, cp_llama(r.seq, "p2p"), two, cp2_zero, r.zero_tps, r.zero_gib});
  }
  return runs;
}
// Predicted with the H200's calibration. Memory within 5% for all eleven: each layer keeps its input,
// one layer's activations exist while it is recomputed, the ring's (or all-to-all's) buffers of one
// attention backward, and the fp32 gradients stay whole on every cp rank (the distributed optimizer
// shards only the optimizer state). Step time: not within 15%. The calibration's one attention rate
// (192 TFLOP/s, measured at sequence 1024 and heads of 64) prices attention, which dominates at
// these lengths; cuDNN runs causal attention of heads of 128 over 16K-128K tokens far faster, so
// every run is predicted slow, the more the longer the sequence (+15-42% at 16K, about 2x at 64K,
// 2.3-2.4x at 128K). Asserted as that known error: predicted slow by more than 10%.
// strata-plan --calibrate now measures cuDNN's attention by length (attention_tflops_by_length; 306
// TFLOP/s at 1K to 666 at 64K on an H100, bench/RESULTS.md). Priced with that table these runs
// come out 20-36% fast, and the Llama 3 8B runs below 10-29% fast: the trainers' attention runs
// slower than cuDNN's graphs alone (the deterministic backward of the 8B runs, strided q/k/v views,
// RoPE and the ring's merges are not in the microbenchmark; a GPT 1.41B trace gives 267 TFLOP/s at
// 1K against the table's 306). So the shipped calibration keeps its one rate. The calibrator now
// times the deterministic backward (where its scratch fits) at heads of 64 and of 128; it has not
// run on a GPU since, so no file here holds that table yet.
TEST(Plan, ContextParallelMemoryWithin5PercentStepTimeKnownSlow) {
  const std::vector<Measured> runs = cp_runs();
  const auto rows = compare(runs, h200_measured());
  print(rows);
  ASSERT_EQ(rows.size(), 11u);
  for (const Comparison& c : rows) {
    EXPECT_LE(std::abs(c.memory_error()), 0.05) << c.run->name;
    EXPECT_GT(c.time_error(), 0.10) << c.run->name;  // predicted slower than measured
  }
}

// Attention's rate by sequence length (attention_tflops_by_length): flat below and above the measured
// lengths, linear in log(length) between them, written and read back; lengths out of order are
// refused naming the entry; without the table every length gets attention_tflops. The planner
// prices the ring's attention at the rate of its blocks (s / cp) and the all-to-all's at whole
// sequences (s): with a table whose rate is low at s / 2 and high at s, cp=2 p2p computes longer
// than cp=2 a2a; without it the two compute the same.
TEST(Plan, AttentionRateByLengthIsInterpolatedAndPricedAtTheEnginesLength) {
  plan::Calibration c = h200_measured();
  c.attention_by_length = {{1024, 300}, {4096, 500}, {16384, 600}};
  EXPECT_EQ(c.attention_tflops_at(512), 300);
  EXPECT_NEAR(c.attention_tflops_at(2048), 400, 1e-9);
  EXPECT_NEAR(c.attention_tflops_at(8192), 550, 1e-9);
  EXPECT_EQ(c.attention_tflops_at(16384), 600);
  EXPECT_EQ(c.attention_tflops_at(1 << 20), 600);
  const plan::Calibration back = plan::parse_calibration(plan::calibration_json(c), "by_length.json");
  ASSERT_EQ(back.attention_by_length.size(), 3u);
  EXPECT_EQ(back.attention_by_length[1].seq, 4096);
  EXPECT_EQ(back.attention_by_length[1].tflops, 500);
  std::string text = plan::calibration_json(c);
  const std::string second = "\"seq\": 4096";
  text.replace(text.find(second), second.size(), "\"seq\": 512");
  try {
    plan::parse_calibration(text, "by_length.json");
    ADD_FAILURE() << "lengths out of order were accepted";
  } catch (const strata::ConfigError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("by_length.json"), std::string::npos) << m;
    EXPECT_NE(m.find("attention_tflops_by_length[1].seq"), std::string::npos) << m;
  }
  EXPECT_EQ(h200_measured().attention_tflops_at(65536), h200_measured().attention_tflops);
  // Entries of several head sizes: a model's attention takes those of the measured size nearest to
  // its own (in log), each size's lengths ascending on their own; written and read back.
  plan::Calibration sized = h200_measured();
  sized.attention_by_length = {{1024, 200, 64}, {4096, 300, 64}, {1024, 400, 128}, {4096, 600, 128}};
  EXPECT_EQ(sized.attention_tflops_at(1024, 64), 200);
  EXPECT_EQ(sized.attention_tflops_at(8192, 64), 300);
  EXPECT_NEAR(sized.attention_tflops_at(2048, 128), 500, 1e-9);
  EXPECT_EQ(sized.attention_tflops_at(1024, 80), 200);   // nearer 64
  EXPECT_EQ(sized.attention_tflops_at(1024, 96), 400);   // nearer 128
  EXPECT_EQ(sized.attention_tflops_at(1024, 192), 400);  // beyond the largest
  EXPECT_EQ(sized.attention_tflops_at(1024), 200);       // no head size asked: the first entry's
  const plan::Calibration sized_back = plan::parse_calibration(plan::calibration_json(sized), "sized.json");
  ASSERT_EQ(sized_back.attention_by_length.size(), 4u);
  EXPECT_EQ(sized_back.attention_by_length[2].head_dim, 128);
  EXPECT_NEAR(sized_back.attention_tflops_at(2048, 128), 500, 1e-9);
  std::string repeated = plan::calibration_json(sized);
  const std::string fourth = "\"seq\": 4096, \"head_dim\": 128";
  ASSERT_NE(repeated.find(fourth), std::string::npos) << repeated;
  repeated.replace(repeated.find(fourth), fourth.size(), "\"seq\": 1024, \"head_dim\": 128");
  try {
    plan::parse_calibration(repeated, "sized.json");
    ADD_FAILURE() << "a length repeated within one head size was accepted";
  } catch (const strata::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("attention_tflops_by_length[3].seq"), std::string::npos) << e.what();
  }

  const plan::Cluster two{2, 1, 141};
  plan::Layout cp2 = layout(1, 1, 1, 1, "1f1b", 1, RecomputeGranularity::full);
  cp2.cp = 2;
  auto compute = [&](const plan::Calibration& cal, const char* comm) {
    trainer::TrainArgs model = model_of(cp_llama(16384, comm));
    const trainer::TrainArgs a = plan::args_of(model, two, cp2);
    return plan::predict_step(a, cp2, two, cal).compute;
  };
  plan::Calibration steep = h200_measured();
  steep.attention_by_length = {{8192, 200}, {16384, 800}};
  EXPECT_GT(compute(steep, "p2p"), compute(steep, "a2a") * 1.2);
  EXPECT_NEAR(compute(h200_measured(), "p2p"), compute(h200_measured(), "a2a"), 1e-9);
}

// Entries that name their backward (strata-plan --calibrate times both): a run with
// --deterministic-attention (the default) is priced at the head size's deterministic entries, one
// with --no-deterministic-attention at its atomic ones; entries that name none serve both, and a head
// size with entries of one kind only serves the other kind's runs too. Lengths ascend within each
// head size and backward; the key is written and read back; an unknown kind is refused, naming the
// entry and the two kinds.
TEST(Plan, AttentionEntriesOfEachBackwardPriceTheRunsThatUseIt) {
  using B = plan::AttentionBackward;
  plan::Calibration c = h200_measured();
  c.attention_by_length = {{1024, 300, 128, B::atomic},  {4096, 520, 128, B::atomic}, {1024, 260, 128, B::deterministic},
                           {4096, 390, 128, B::deterministic}, {1024, 200, 64, B::deterministic}};
  EXPECT_EQ(c.attention_tflops_at(4096, 128, /*deterministic=*/false), 520);
  EXPECT_EQ(c.attention_tflops_at(4096, 128, /*deterministic=*/true), 390);
  EXPECT_EQ(c.attention_tflops_at(4096, 128), 390);  // the trainers' default
  EXPECT_EQ(c.attention_tflops_at(4096, 64, /*deterministic=*/false), 200);  // heads of 64: deterministic entries only
  const plan::Calibration back = plan::parse_calibration(plan::calibration_json(c), "both.json");
  ASSERT_EQ(back.attention_by_length.size(), 5u);
  EXPECT_EQ(back.attention_by_length[2].backward, B::deterministic);
  EXPECT_EQ(back.attention_by_length[0].backward, B::atomic);
  EXPECT_EQ(back.attention_tflops_at(4096, 128, false), 520);
  EXPECT_EQ(back.attention_tflops_at(4096, 128, true), 390);
  plan::Calibration mixed = h200_measured();  // an entry naming no backward serves both kinds
  mixed.attention_by_length = {{1024, 300, 128, B::any}, {4096, 450, 128, B::atomic}};
  EXPECT_NEAR(mixed.attention_tflops_at(2048, 128, false), 375, 1e-9);
  EXPECT_EQ(mixed.attention_tflops_at(4096, 128, true), 300);
  std::string text = plan::calibration_json(c);
  const std::string kind = "\"backward\": \"atomic\"";
  ASSERT_NE(text.find(kind), std::string::npos) << text;
  text.replace(text.find(kind), kind.size(), "\"backward\": \"fused\"");
  try {
    plan::parse_calibration(text, "both.json");
    ADD_FAILURE() << "an unknown backward was accepted";
  } catch (const strata::ConfigError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("both.json"), std::string::npos) << m;
    EXPECT_NE(m.find("attention_tflops_by_length[0].backward"), std::string::npos) << m;
    EXPECT_NE(m.find("\"deterministic\" or \"atomic\""), std::string::npos) << m;
    EXPECT_NE(m.find("\"fused\""), std::string::npos) << m;
  }
  // The planner passes the run's flag: with atomic entries faster, --no-deterministic-attention computes faster.
  const plan::Cluster one{1, 1, 141};
  const plan::Layout single = layout(1, 1, 1, 1);
  auto compute = [&](bool deterministic) {
    trainer::TrainArgs model = model_of(cp_llama(4096, "p2p"));
    model.deterministic_attention = deterministic;
    const trainer::TrainArgs a = plan::args_of(model, one, single);
    return plan::predict_step(a, single, one, c).compute;
  };
  EXPECT_LT(compute(false), compute(true));
}

// Llama 3 8B (seq 8192, global batch 16, micro-batch 1) on 4 H200 (bench/RESULTS.md, 2026-11-27),
// predicted from the calibration strata-plan --calibrate measured on an H200: step time within 15%
// for every layout (worst: tp=4 predicted 11.5% slow) and memory within 5% for every layout. Memory
// was 5-7% short for interleaved and tp=4 while the estimate counted Korthikanti's 17 h / tp per
// token under sequence parallelism: strata's column-parallel layers (qkv, fc1) keep their gathered
// input, h each whole on every tp rank, and SwiGLU 14336 keeps 3 x 14336 (fc1's [gate; up] and the
// activation), not 8 h; the GQA projection keeps (32 + 16) x 128, not 3 h.
std::vector<std::string> llama3_8b() {
  return {"--num-layers", "32", "--hidden-size", "4096", "--num-attention-heads", "32", "--group-query-attention", "--num-query-groups", "8",
          "--ffn-hidden-size", "14336", "--seq-length", "8192", "--global-batch-size", "16", "--vocab-size", "128256",
          "--position-embedding-type", "rope", "--normalization", "RMSNorm", "--swiglu", "--untie-embeddings-and-output-weights",
          "--disable-bias-linear", "--rotary-base", "500000"};
}
TEST(Plan, Llama8BOnFourGpusStepTimeWithin15PercentAndMemoryWithin5Percent) {
  using R = RecomputeGranularity;
  const plan::Cluster four{4, 1, 141};
  plan::Layout cp2 = layout(2, 1, 1, 1, "1f1b", 1, R::none, true);
  cp2.cp = 2;
  const std::vector<Measured> runs = {
      {"Llama 3 8B, dp=4 dist-opt", "2026-11-27, 4 H200", llama3_8b(), four, layout(1, 1, 4, 1, "1f1b", 1, R::none, true), 41866, 102.51},
      {"Llama 3 8B, tp=2 dp=2 dist-opt", "2026-11-27, 4 H200", llama3_8b(), four, layout(2, 1, 2, 1, "1f1b", 1, R::none, true), 38288, 64.60},
      {"Llama 3 8B, tp=2 cp=2 dist-opt", "2026-11-27, 4 H200", llama3_8b(), four, cp2, 34281, 54.78},
      {"Llama 3 8B, tp=2 pp=2 1f1b", "2026-11-27, 4 H200", llama3_8b(), four, layout(2, 2, 1, 1), 35183, 53.35},
      {"Llama 3 8B, tp=4", "2026-11-27, 4 H200", llama3_8b(), four, layout(4, 1, 1, 1), 32688, 45.66},
      {"Llama 3 8B, tp=2 pp=2 interleaved v=2", "2026-11-27, 4 H200", llama3_8b(), four, layout(2, 2, 1, 1, "interleaved", 2), 35948,
       58.13},
      {"Llama 3 8B, pp=4 zero-bubble selective", "2026-11-27, 4 H200", llama3_8b(), four,
       layout(1, 4, 1, 1, "zero-bubble", 1, R::selective), 32168, 76.38},
  };
  const auto rows = compare(runs, h200_measured());
  print(rows);
  ASSERT_EQ(rows.size(), 7u);
  for (const Comparison& c : rows) {
    EXPECT_LE(std::abs(c.time_error()), 0.15) << c.run->name;
    EXPECT_LE(std::abs(c.memory_error()), 0.05) << c.run->name;
  }
}

// The bubble is the schedule table's idle share (docs/PIPELINE.md: pp = 4, m = 8 gives 0.273 for
// 1F1B, 0.158 interleaved with v = 2, 0.111 zero-bubble), and beyond 128 micro-batches its closed form.
TEST(Plan, BubbleIsTheScheduleTablesIdleShare) {
  using strata::pipeline::ScheduleKind;
  EXPECT_NEAR(plan::bubble_fraction(ScheduleKind::one_f_one_b, 4, 8, 1), 3.0 / 11.0, 1e-12);
  EXPECT_NEAR(plan::bubble_fraction(ScheduleKind::interleaved, 4, 8, 2), 0.158, 5e-4);
  EXPECT_NEAR(plan::bubble_fraction(ScheduleKind::zero_bubble, 4, 8, 1), 0.111, 5e-4);
  EXPECT_EQ(plan::bubble_fraction(ScheduleKind::one_f_one_b, 1, 8, 1), 0.0);
  EXPECT_NEAR(plan::bubble_fraction(ScheduleKind::one_f_one_b, 8, 256, 1), 7.0 / 263.0, 1e-12);
  EXPECT_NEAR(plan::bubble_fraction(ScheduleKind::one_f_one_b, 4, 128, 1), 3.0 / 131.0, 1e-12);  // the table agrees with the form
}

// The step's parts: tensor-parallel time appears with tp > 1 and grows when tp leaves the node
// (InfiniBand), data-parallel time with dp > 1, the bubble with pp > 1; recompute adds time and
// saves memory.
TEST(Plan, StepTimeChargesEachPartWhereItArises) {
  const trainer::TrainArgs model = trainer::parse_flags("gpt", gpt(24, 2048, 16, 1024, 64));
  const plan::Calibration calibration = h100();
  auto step = [&](plan::Cluster cluster, plan::Layout l) {
    const trainer::TrainArgs a = plan::args_of(model, cluster, l);
    trainer::validate(a);
    return plan::predict_step(a, l, cluster, calibration);
  };
  const plan::StepTime one = step({1, 1, 80}, layout(1, 1, 1, 8));
  EXPECT_EQ(one.communication(), 0.0);
  EXPECT_EQ(one.bubble, 0.0);
  const plan::StepTime tp_in_node = step({8, 1, 80}, layout(8, 1, 1, 8));
  const plan::StepTime tp_across_nodes = step({4, 2, 80}, layout(8, 1, 1, 8));
  EXPECT_GT(tp_in_node.tensor_parallel, 0.0);
  EXPECT_GT(tp_across_nodes.tensor_parallel, 2 * tp_in_node.tensor_parallel);
  EXPECT_GT(step({2, 1, 80}, layout(1, 1, 2, 8)).data_parallel, 0.0);
  const plan::StepTime piped = step({2, 1, 80}, layout(1, 2, 1, 8));
  EXPECT_NEAR(piped.bubble / (piped.total() - piped.bubble - piped.data_parallel - piped.optimizer - piped.overhead),
              plan::bubble_fraction(strata::pipeline::ScheduleKind::one_f_one_b, 2, 8, 1) /
                  (1 - plan::bubble_fraction(strata::pipeline::ScheduleKind::one_f_one_b, 2, 8, 1)),
              1e-9);
  const plan::StepTime full = step({1, 1, 80}, layout(1, 1, 1, 8, "1f1b", 1, RecomputeGranularity::full));
  EXPECT_GT(full.recompute, 0.0);
  EXPECT_NEAR(full.total(), full.compute + full.recompute + full.communication() + full.bubble + full.optimizer + full.overhead, 1e-9);
  const trainer::TrainArgs a = plan::args_of(model, {1, 1, 80}, layout(1, 1, 1, 8));
  EXPECT_LT(plan::predict_memory(a, calibration, RecomputeGranularity::full).per_gpu(),
            plan::predict_memory(a, calibration, RecomputeGranularity::selective).per_gpu());
  EXPECT_LT(plan::predict_memory(a, calibration, RecomputeGranularity::selective).per_gpu(),
            plan::predict_memory(a, calibration, RecomputeGranularity::none).per_gpu());
}

// --moe-layer-freq: a dense layer is timed as a dense layer (no router, no all-to-all, no host
// reads of the token counts) and the pipeline stage that holds it pays for it alone: the Mixtral
// shape with its first two layers dense sits between the all-MoE model and the dense one, and on
// pp 2 only the second stage's layers all pay the experts' exchange.
TEST(Plan, DenseLayersOfAMoeModelAreTimedAsDense) {
  const plan::Calibration calibration = h100();
  auto step = [&](std::vector<std::string> more, plan::Cluster cluster, plan::Layout l) {
    std::vector<std::string> flags = mixtral_small();
    flags.insert(flags.end(), more.begin(), more.end());
    trainer::TrainArgs model = trainer::parse_flags("gpt", flags);
    const trainer::TrainArgs a = plan::args_of(model, cluster, l);
    trainer::validate(a);
    return plan::predict_step(a, l, cluster, calibration);
  };
  // ep = 2 over dp = 2, where the counted exchange has the host read the counts (one GPU has none).
  const plan::Cluster two{2, 1, 80}, four{4, 1, 80};
  plan::Layout ep2 = layout(1, 1, 2, 4), piped_ep2 = layout(1, 2, 2, 2);
  ep2.ep = piped_ep2.ep = 2;
  const plan::StepTime all = step({}, two, ep2);
  const plan::StepTime mixed = step({"--moe-layer-freq", "[0]*2+[1]*6"}, two, ep2);
  EXPECT_GT(all.overhead, calibration.step_overhead_ms);
  EXPECT_LT(mixed.overhead, all.overhead);
  EXPECT_NEAR(mixed.overhead - calibration.step_overhead_ms, (all.overhead - calibration.step_overhead_ms) * 6 / 8, 1e-9);
  EXPECT_NE(mixed.compute, all.compute);
  const plan::StepTime piped = step({"--moe-layer-freq", "[0]*4+[1]*4"}, four, piped_ep2);
  const plan::StepTime piped_all = step({}, four, piped_ep2);
  EXPECT_GT(piped.overhead, calibration.step_overhead_ms);
  EXPECT_NEAR(piped.overhead, piped_all.overhead, 1e-9) << "the slowest stage holds four MoE layers either way";
}

// Multi-latent attention is timed as its own projections (the down projections replicated over tp,
// the up and output ones split by heads) and an attention of qk + pe dimensions over one key/value
// head per query head, not as the plain attention of the same hidden size: a larger key/value
// latent costs more, and a plain model of that hidden size costs something else.
TEST(Plan, MultiLatentAttentionIsTimedAsItsProjections) {
  const plan::Calibration calibration = h100();
  auto step = [&](std::vector<std::string> more, plan::Layout l) {
    std::vector<std::string> flags = {"--num-layers", "4", "--hidden-size", "2048", "--num-attention-heads", "16",
                                      "--seq-length", "1024", "--global-batch-size", "8", "--vocab-size", "32000", "--swiglu"};
    flags.insert(flags.end(), more.begin(), more.end());
    const trainer::TrainArgs model = trainer::parse_flags("llama", flags);
    const plan::Cluster cluster{l.tp, 1, 80};
    const trainer::TrainArgs a = plan::args_of(model, cluster, l);
    trainer::validate(a);
    return plan::predict_step(a, l, cluster, calibration);
  };
  const std::vector<std::string> mla = {"--multi-latent-attention", "--q-lora-rank", "512", "--qk-head-dim", "128",
                                        "--qk-pos-emb-head-dim", "64", "--v-head-dim", "128"};
  auto with_rank = [&](const char* rank) {
    std::vector<std::string> f = mla;
    f.insert(f.end(), {"--kv-lora-rank", rank});
    return f;
  };
  const plan::StepTime small = step(with_rank("128"), layout(1, 1, 1, 8)), large = step(with_rank("1024"), layout(1, 1, 1, 8));
  const plan::StepTime plain = step({}, layout(1, 1, 1, 8));
  EXPECT_GT(large.compute, small.compute) << "the key/value latent's up projection grows with its rank";
  EXPECT_GT(std::abs(small.compute - plain.compute), 1e-3 * plain.compute) << "MLA was timed as plain attention";
}

}  // namespace
