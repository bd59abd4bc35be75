// train_mixtral: a Mixtral-style mixture-of-experts model (the Llama block with a top-k routed MoE
// MLP in every layer; 8 experts by default) with tensor, sequence, expert, pipeline and data
// parallelism, on CPU threads or GPUs. Megatron's MoE flags: docs/MOE.md.
#include "trainer/entry.hpp"

int main(int argc, char** argv) { return trainer::main_mixtral(argc, argv); }
