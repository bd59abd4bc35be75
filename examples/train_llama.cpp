// train_llama: Llama style model (RoPE, RMSNorm, SwiGLU, GQA), tensor + sequence + data parallel on
// CPU threads.
#include "trainer/entry.hpp"

int main(int argc, char** argv) { return trainer::main_llama(argc, argv); }
