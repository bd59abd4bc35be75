// pretrain_gpt: Megatron's pretrain_gpt.py command line over strata's compiled models. The
// architecture flags choose the model (examples/trainer/args.hpp, resolve_architecture):
//   pretrain_gpt --num-layers 4 --hidden-size 128 ...                          # GPT-2 (Megatron's defaults)
//   pretrain_gpt --position-embedding-type rope --normalization RMSNorm --swiglu
//                --untie-embeddings-and-output-weights --disable-bias-linear ...  # Llama (one line)
//   ... the Llama flags --num-experts 8 --moe-router-topk 2 ...                 # Mixtral (mixture of experts)
//   pretrain_gpt --help                                                        # every flag
#include "trainer/trainer.hpp"

int main(int argc, char** argv) {
  return trainer::run_main<strata::models::Gpt, strata::models::Llama, strata::models::Mixtral>("gpt", "pretrain_gpt", argc, argv);
}
