// TensorBoard event files (trainer/tensorboard.hpp): CRC-32C's check value, and a file read back
// record by record -- lengths and data under their masked CRCs, the version record first, then
// each scalar's tag, step and value decoded from the protocol buffer. (tests/tensorboard/
// read_events.py reads the trainer's files with TensorBoard's own reader where it is installed.)
// The trainer's --tensorboard-dir: Megatron's scalars at every iteration, equal to the run's losses
// in float, and the validation loss at each evaluation.
#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "trainer/tensorboard.hpp"
#include "trainer/trainer.hpp"

// Every case of this file in a namespace of its own, so that several test files can share a
// translation unit (tests/CMakeLists.txt, strata_add_gtest_group).
namespace test_tensorboard_cases {

namespace {

using trainer::tensorboard_detail::crc32c;
using trainer::tensorboard_detail::masked_crc32c;

TEST(TensorBoard, Crc32cCheckValue) {
  const std::string text = "123456789";
  EXPECT_EQ(crc32c(std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(text.data()), text.size())),
            0xe3069283u);
}

struct Scalar {
  std::string tag;
  std::int64_t step = -1;
  float value = 0;
};

// A minimal protocol-buffer reader for the fields the writer emits.
struct Reader {
  const std::uint8_t* p;
  const std::uint8_t* end;
  std::uint64_t varint() {
    std::uint64_t v = 0;
    for (int shift = 0; p < end; shift += 7) {
      const std::uint8_t b = *p++;
      v |= static_cast<std::uint64_t>(b & 0x7f) << shift;
      if (!(b & 0x80)) break;
    }
    return v;
  }
  std::uint64_t fixed(int n) {
    std::uint64_t v = 0;
    for (int i = 0; i < n; ++i) v |= static_cast<std::uint64_t>(*p++) << (8 * i);
    return v;
  }
};

// Every record of an event file, each checked against its masked CRCs: the file version and the
// scalars (tag, step, value).
void read_events(const std::filesystem::path& file, std::string& version, std::vector<Scalar>& scalars) {
  std::ifstream in(file, std::ios::binary);
  const std::vector<std::uint8_t> bytes((std::istreambuf_iterator<char>(in)), {});
  std::size_t at = 0;
  while (at < bytes.size()) {
    ASSERT_LE(at + 12, bytes.size());
    const std::span<const std::uint8_t> length_bytes(bytes.data() + at, 8);
    std::uint64_t length = 0;
    for (int i = 0; i < 8; ++i) length |= static_cast<std::uint64_t>(bytes[at + i]) << (8 * i);
    std::uint32_t length_crc = 0, data_crc = 0;
    std::memcpy(&length_crc, bytes.data() + at + 8, 4);
    ASSERT_EQ(length_crc, masked_crc32c(length_bytes));
    ASSERT_LE(at + 12 + length + 4, bytes.size());
    const std::span<const std::uint8_t> data(bytes.data() + at + 12, length);
    std::memcpy(&data_crc, bytes.data() + at + 12 + length, 4);
    ASSERT_EQ(data_crc, masked_crc32c(data));
    at += 12 + length + 4;
    Reader event{data.data(), data.data() + data.size()};
    Scalar s;
    while (event.p < event.end) {
      const std::uint64_t key = event.varint();
      const int field = static_cast<int>(key >> 3), wire = static_cast<int>(key & 7);
      if (field == 1 && wire == 1) {
        EXPECT_GT(std::bit_cast<double>(event.fixed(8)), 1.6e9);  // wall time, seconds since 1970
      } else if (field == 2 && wire == 0) {
        s.step = static_cast<std::int64_t>(event.varint());
      } else if (field == 3 && wire == 2) {
        const std::uint64_t n = event.varint();
        version.assign(reinterpret_cast<const char*>(event.p), n);
        event.p += n;
      } else if (field == 5 && wire == 2) {
        const std::uint64_t n = event.varint();
        Reader summary{event.p, event.p + n};
        event.p += n;
        ASSERT_EQ(summary.varint(), (1u << 3) | 2u);  // Summary.value
        const std::uint64_t m = summary.varint();
        Reader value{summary.p, summary.p + m};
        while (value.p < value.end) {
          const std::uint64_t k = value.varint();
          if (k == ((1u << 3) | 2u)) {
            const std::uint64_t t = value.varint();
            s.tag.assign(reinterpret_cast<const char*>(value.p), t);
            value.p += t;
          } else if (k == ((2u << 3) | 5u)) {
            s.value = std::bit_cast<float>(static_cast<std::uint32_t>(value.fixed(4)));
          } else {
            FAIL() << "unexpected Value field key " << k;
          }
        }
      } else {
        FAIL() << "unexpected Event field " << field << " wire type " << wire;
      }
    }
    if (!s.tag.empty()) scalars.push_back(s);
  }
}

TEST(TensorBoard, EventFileReadsBackRecordByRecord) {
  const auto dir = std::filesystem::temp_directory_path() / ("strata_tensorboard_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::path file;
  {
    trainer::TensorBoardWriter writer(dir);
    writer.scalar("lm loss", 5.25, 1);
    writer.scalar("learning-rate", 3e-4, 1);
    writer.scalar("lm loss", 4.5, 300);
    writer.flush();
    file = writer.path();
  }
  EXPECT_NE(file.filename().string().find("events.out.tfevents."), std::string::npos);
  std::vector<Scalar> scalars;
  std::string version;
  read_events(file, version, scalars);
  EXPECT_EQ(version, "brain.Event:2");
  ASSERT_EQ(scalars.size(), 3u);
  EXPECT_EQ(scalars[0].tag, "lm loss");
  EXPECT_EQ(scalars[0].step, 1);
  EXPECT_EQ(scalars[0].value, 5.25f);
  EXPECT_EQ(scalars[1].tag, "learning-rate");
  EXPECT_EQ(scalars[1].value, 3e-4f);
  EXPECT_EQ(scalars[2].step, 300);
  EXPECT_EQ(scalars[2].value, 4.5f);
  std::filesystem::remove_all(dir);
}

TEST(TensorBoard, TrainerWritesMegatronsScalarsEveryIterationAndTheValidationLoss) {
  const auto dir = std::filesystem::temp_directory_path() / ("strata_tensorboard_run_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  trainer::TrainArgs a = trainer::default_args("gpt");
  a.model.num_layers = 2;
  a.model.hidden_size = 32;
  a.model.num_attention_heads = 4;
  a.model.ffn_hidden_size = 64;
  a.model.seq_length = 16;
  a.micro_batch_size = 2;
  a.global_batch_size = 4;
  a.train_iters = 6;
  a.lr_warmup_iters = 1;
  a.log_interval = 3;
  a.eval_interval = 3;
  a.eval_iters = 1;
  a.sample_tokens = 0;
  a.quiet = true;
  a.tensorboard_dir = dir.string();
  const auto run = trainer::train<strata::models::Gpt>(a);
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(dir)) files.push_back(e.path());
  ASSERT_EQ(files.size(), 1u);
  std::string version;
  std::vector<Scalar> scalars;
  read_events(files[0], version, scalars);
  std::map<std::string, std::vector<Scalar>> by_tag;
  for (const Scalar& s : scalars) by_tag[s.tag].push_back(s);
  for (const char* tag : {"lm loss", "learning-rate", "grad-norm", "throughput (tokens/s)", "consumed-samples"})
    EXPECT_EQ(by_tag[tag].size(), 6u) << tag;
  ASSERT_EQ(by_tag["lm loss"].size(), run.losses.size());
  for (std::size_t i = 0; i < run.losses.size(); ++i) {
    EXPECT_EQ(by_tag["lm loss"][i].step, static_cast<std::int64_t>(i + 1));
    EXPECT_EQ(by_tag["lm loss"][i].value, static_cast<float>(run.losses[i]));
  }
  ASSERT_EQ(by_tag["lm loss validation"].size(), run.validation_losses.size());
  for (std::size_t i = 0; i < run.validation_losses.size(); ++i) {
    EXPECT_EQ(by_tag["lm loss validation"][i].step, run.validation_losses[i].first);
    EXPECT_EQ(by_tag["lm loss validation"][i].value, static_cast<float>(run.validation_losses[i].second));
  }
  EXPECT_EQ(by_tag["consumed-samples"].back().value, 24.0f);
  std::filesystem::remove_all(dir);
}

TEST(TensorBoard, WeightsAndBiasesFlagsAreRefusedNamingTheAlternative) {
  trainer::TrainArgs a = trainer::default_args("gpt");
  a.wandb_project = "my-project";
  try {
    trainer::validate(a);
    ADD_FAILURE() << "--wandb-project was accepted";
  } catch (const strata::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("--wandb-project my-project"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("--tensorboard-dir"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace test_tensorboard_cases
