// The trainers' main functions, compiled once beside the instances of the trainers' loop (CMake adds
// each model's to its first instance's translation unit in strata_trainer_<model>; see
// examples/CMakeLists.txt). A program's main() calls one of them, so its own translation unit does
// not parse the loop (trainer.hpp, about 20 s of compiling) again.
#pragma once

namespace trainer {

// main() of train_gpt / train_llama / train_mixtral: the flags over the model's architecture
// preset, the run, errors as one line on stderr and exit status 1 (trainer.hpp's main_for).
int main_gpt(int argc, char** argv);      // strata_trainer_gpt
int main_llama(int argc, char** argv);    // strata_trainer_llama
int main_mixtral(int argc, char** argv);  // strata_trainer_mixtral

}  // namespace trainer
