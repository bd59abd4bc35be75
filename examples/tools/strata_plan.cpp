// strata-plan: the best parallel layout for a model on a cluster, predicted before a GPU is rented
// (examples/tools/plan/planner.hpp; docs/PLANNING.md). The model is Megatron's flags, read by the
// trainers' own parser; the cluster and the output are strata-plan's flags:
//
//   strata-plan --num-layers 32 --hidden-size 4096 --num-attention-heads 32 --group-query-attention
//     --num-query-groups 8 --ffn-hidden-size 14336 --position-embedding-type rope --normalization RMSNorm
//     --swiglu --untie-embeddings-and-output-weights --disable-bias-linear --vocab-size 128256
//     --seq-length 8192 --global-batch-size 512
//     --gpus-per-node 8 --nodes 8 --gpu-memory-gib 80 --calibration bench/calibration/h100_node.json --svg plan.svg
//   strata-plan --calibrate gpu.json --calibration bench/calibration/h100_node.json   # GPU 0 (and its link to GPU 1)
//   strata-plan --calibrate cpu.json --calibrate-cpu   # the CPU backend and the in-process communicator
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "plan/calibrate.hpp"
#include "plan/calibrate_cuda.hpp"
#include "plan/planner.hpp"

namespace {

const char* kUsage =
    "usage: strata-plan <Megatron model flags> --seq-length N --global-batch-size N\n"
    "                   --gpus-per-node N --nodes N --gpu-memory-gib G --calibration FILE\n"
    "                   [--top N] [--svg FILE] [--max-context-parallel N] [--max-micro-batch N]\n"
    "       strata-plan --calibrate FILE [--calibration BASE] [--calibrate-cpu] [--calibrate-ranks N]\n"
    "The model flags are pretrain_gpt's (GPT by default; the Llama set and --num-experts as the trainers take them).\n";

[[noreturn]] void usage_error(const std::string& message) {
  std::cerr << "error: " << message << "\n" << kUsage;
  std::exit(1);
}

// The value of a strata-plan flag: a whole number in [low, high] or a positive real.
long long integer_value(const std::string& flag, const std::string& text, long long low, long long high, const char* meaning) {
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || v < low || v > high)
    usage_error(flag + " " + text + ": it must be a whole number in [" + std::to_string(low) + ", " + std::to_string(high) + "] (" + meaning + ")");
  return v;
}
double real_value(const std::string& flag, const std::string& text, const char* meaning) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || !(v > 0) || v > 1e9) usage_error(flag + " " + text + ": it must be a number > 0 (" + meaning + ")");
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> model_flags;
  plan::Cluster cluster;
  plan::SearchSpace space;
  std::string calibration_file, svg_file, calibrate_file;
  int top = 10, calibrate_ranks = 2;
  bool calibrate_cpu = false;
  bool have_gpus = false, have_nodes = false, have_memory = false, have_seq = false, have_batch = false;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage_error(flag + " needs a value");
      return argv[++i];
    };
    if (flag == "--help" || flag == "-h") {
      std::cout << kUsage;
      return 0;
    } else if (flag == "--gpus-per-node") {
      cluster.gpus_per_node = static_cast<int>(integer_value(flag, value(), 1, 1024, "GPUs in each node, joined by NVLink"));
      have_gpus = true;
    } else if (flag == "--nodes") {
      cluster.nodes = static_cast<int>(integer_value(flag, value(), 1, 1 << 20, "nodes, joined by InfiniBand"));
      have_nodes = true;
    } else if (flag == "--gpu-memory-gib") {
      cluster.gpu_memory_gib = real_value(flag, value(), "memory of each GPU in GiB, e.g. 80 for an H100 SXM");
      have_memory = true;
    } else if (flag == "--calibration") {
      calibration_file = value();
    } else if (flag == "--svg") {
      svg_file = value();
    } else if (flag == "--top") {
      top = static_cast<int>(integer_value(flag, value(), 1, 1 << 20, "layouts to print"));
    } else if (flag == "--max-context-parallel") {
      space.max_cp = static_cast<int>(integer_value(flag, value(), 1, 1 << 20, "the largest context-parallel size to try"));
    } else if (flag == "--max-micro-batch") {
      space.max_micro_batch = static_cast<int>(integer_value(flag, value(), 1, 1 << 20, "the largest micro-batch size to try"));
    } else if (flag == "--calibrate") {
      calibrate_file = value();
    } else if (flag == "--calibrate-cpu") {
      calibrate_cpu = true;
    } else if (flag == "--calibrate-ranks") {
      calibrate_ranks = static_cast<int>(integer_value(flag, value(), 2, 64, "threads of the collective measurements"));
    } else {
      if (flag == "--seq-length") have_seq = true;
      if (flag == "--global-batch-size") have_batch = true;
      for (const char* parallel : {"--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--context-parallel-size",
                                   "--expert-model-parallel-size", "--micro-batch-size", "--world-size",
                                   "--num-layers-per-virtual-pipeline-stage", "--recompute-granularity", "--recompute-modules",
                                   "--use-distributed-optimizer"})
        if (flag == parallel) usage_error(flag + " is what strata-plan chooses; leave it out (the plan tries every value)");
      model_flags.push_back(flag);
    }
  }
  try {
    if (!calibrate_file.empty()) {
      plan::Calibration c;
#ifdef STRATA_WITH_CUDA
      if (!calibrate_cpu && plan::visible_cuda_devices() > 0) {
        if (calibration_file.empty())
          usage_error("--calibrate on a GPU measures GEMMs, memory bandwidth and NVLink and keeps the rest (attention, "
                      "InfiniBand, overheads) from a base file: pass --calibration bench/calibration/h100_node.json, or "
                      "--calibrate-cpu for the CPU");
        c = plan::calibrate_cuda(plan::load_calibration(calibration_file), 10, &std::cout);
      }
#else
      (void)calibrate_cpu;  // the only kind this build measures
#endif
      if (c.gemm.empty()) {
        plan::CalibrateOptions options;
        options.ranks = calibrate_ranks;
        c = plan::calibrate_cpu(options);
      }
      std::ofstream out(calibrate_file);
      out << plan::calibration_json(c);
      if (!out) usage_error("--calibrate " + calibrate_file + ": cannot write the file (does its directory exist?)");
      std::cout << "wrote " << calibrate_file << " (" << c.name << "; " << c.gemm.size() << " GEMM shapes, up to " << c.peak_tflops * 1e3
                << " GFLOP/s)\n";
      return 0;
    }
    if (!have_seq) usage_error("--seq-length is missing: the plan needs the tokens per sequence");
    if (!have_batch) usage_error("--global-batch-size is missing: the plan needs the sequences per step");
    if (!have_gpus || !have_nodes || !have_memory)
      usage_error(std::string(!have_gpus ? "--gpus-per-node" : !have_nodes ? "--nodes" : "--gpu-memory-gib") +
                  " is missing: the plan needs the cluster (--gpus-per-node, --nodes, --gpu-memory-gib)");
    if (calibration_file.empty())
      usage_error("--calibration is missing: pass a calibration file (bench/calibration/h100_node.json for H100 nodes, or one written "
                  "by --calibrate)");
    const plan::Calibration calibration = plan::load_calibration(calibration_file);
    trainer::TrainArgs model = trainer::parse_flags("gpt", model_flags);
    if (model.tokenizer.vocab_size > 0) model.model.vocab_size = static_cast<int>(model.tokenizer.vocab_size);
    const plan::Plan p = plan::make_plan(model, cluster, calibration, space);
    std::cout << "strata-plan: " << model.model_kind << ", " << model.model.num_layers << " layers x " << model.model.hidden_size
              << ", vocabulary " << model.model.vocab_size << (model.tokenizer.vocab_size > 0 ? "" : " (the byte tokenizer's: pass --vocab-size)")
              << ", seq " << model.model.seq_length << ", global batch " << model.global_batch_size << " on " << cluster.nodes << " x "
              << cluster.gpus_per_node << " GPUs of " << cluster.gpu_memory_gib << " GiB (" << calibration.name << ")\n";
    if (!model.fp8_format.empty()) {
      const char* pricing = model.fp8_recipe == "blockwise" ? "as bf16's (the blockwise recipe is not priced as FP8)"
                            : calibration.fp8_gemm.empty()
                                ? "at the calibration's bf16 rates, with their casts (it has no fp8_gemm_tflops)"
                                : "at the calibration's fp8_gemm_tflops, with their casts";
      std::cout << "note: --fp8-format " << model.fp8_format << ": memory counts the FP8 layers' codes and weight caches; step "
                << "times price their GEMMs " << pricing << "\n";
    }
    std::cout << plan::format_table(p, static_cast<std::size_t>(top));
    if (!svg_file.empty()) {
      std::ofstream out(svg_file);
      out << plan::svg(p, model.model_kind + " " + std::to_string(model.model.num_layers) + " x " + std::to_string(model.model.hidden_size) +
                              " on " + std::to_string(cluster.world()) + " GPUs: one point per valid layout");
      if (!out) usage_error("--svg " + svg_file + ": cannot write the file (does its directory exist?)");
      std::cout << "wrote " << svg_file << "\n";
    }
    return p.fitting > 0 ? 0 : 2;
  } catch (const CLI::ParseError& e) {
    usage_error(std::string("a model flag: ") + e.what());
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
}
