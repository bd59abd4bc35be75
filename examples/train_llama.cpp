// train_llama: Llama style model (RoPE, RMSNorm, SwiGLU, GQA), tensor + sequence + data parallel on
// CPU threads.
#include "trainer/trainer.hpp"

int main(int argc, char** argv) { return trainer::main_for<strata::models::Llama>("llama", argc, argv); }
