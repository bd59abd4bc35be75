// train_gpt: GPT-2 style model, tensor + sequence + data parallel on CPU threads.
//   train_gpt                       # the default: small GPT, tp=2 + sequence parallel, shipped corpus
//   train_gpt --help                # every flag (Megatron's names)
#include "trainer/entry.hpp"

int main(int argc, char** argv) { return trainer::main_gpt(argc, argv); }
