// Checkpoints under mpirun (-np 1, 2, 4): a run checkpointed after epoch 2 and resumed ends bit
// for bit where the uninterrupted run ends; checkpoints of another model, truncated or corrupted
// ones are refused with exit code 2 and a message naming the file.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "dpt/checkpoint.h"
#include "dpt/comm.h"
#include "dpt/config.h"
#include "dpt/error.h"
#include "dpt/models.h"
#include "dpt/nn.h"
#include "dpt/run.h"
#include "dpt/safetensors.h"
#include "test_util.h"

namespace dpt {
namespace {

struct Fixture {
  std::unique_ptr<Communicator> comm = test::world_comm();
  std::string dir;
  Fixture() : dir(test::shared_synthetic_dir(*comm, "ckpt", 640, 200, 4)) {}
  ~Fixture() {
    comm->barrier("test barrier");
    if (comm->rank() == 0) std::filesystem::remove_all(dir);
  }
  TrainConfig config() const {
    // The recipe's momentum, weight decay, warm-up and cosine: all of it must resume.
    TrainConfig c = test::small_config("lenet", dir, 3, 64);
    c.eval_batch_size = 100;
    return c;
  }
};

TEST(Checkpoint, ResumeAfterEpochTwoEndsBitForBit) {
  Fixture f;
  TrainConfig full = f.config();
  full.save = f.dir + "/full.safetensors";
  // After epoch 2, and at the end (epoch 3 is not a multiple of 2, so the run's last checkpoint
  // is written then): each named by its step, 10 a epoch (640 images, global batch 64).
  full.checkpoint_every = 2;
  full.keep_checkpoints = 5;
  full.checkpoint_path = f.dir + "/ckpt.safetensors";
  run_training(full, *f.comm);
  const std::string epoch2 = checkpoint_file(full, 20), last = checkpoint_file(full, 30);

  TrainConfig resumed = f.config();
  resumed.resume = epoch2;
  resumed.save = f.dir + "/resumed.safetensors";
  auto hist = run_training(resumed, *f.comm);
  ASSERT_EQ(hist.size(), 1u);  // only epoch 3 ran
  EXPECT_EQ(hist[0].epoch, 3);

  if (f.comm->rank() == 0) {
    StFile a = read_safetensors(full.save), b = read_safetensors(resumed.save);
    ASSERT_EQ(a.tensors.size(), b.tensors.size());
    for (size_t i = 0; i < a.tensors.size(); ++i) {
      EXPECT_EQ(a.tensors[i].name, b.tensors[i].name);
      EXPECT_TRUE(a.tensors[i].bytes == b.tensors[i].bytes) << a.tensors[i].name << " differs";
    }
    StFile ck = read_safetensors(epoch2);
    EXPECT_EQ(ck.metadata.at("epoch"), "2");
    EXPECT_EQ(read_metadata(last).at("epoch"), "3");
    EXPECT_EQ(ck.metadata.at("format"), "dptrain-checkpoint-v1");
    EXPECT_NE(ck.find("optimizer.momentum_buffer"), nullptr);
  }
}

int exit_code_of(const TrainConfig& c, Communicator& comm, std::string* msg) {
  try {
    run_training(c, comm);
  } catch (const Error& e) {
    *msg = e.what();
    return e.exit_code();
  }
  return 0;
}

TEST(Checkpoint, RefusesOtherModelsTruncatedAndCorruptedFiles) {
  Fixture f;
  TrainConfig c = f.config();
  c.epochs = 1;
  c.checkpoint_every = 1;
  c.checkpoint_path = f.dir + "/lenet.safetensors";
  run_training(c, *f.comm);
  const std::string good = c.checkpoint_path;
  const std::string truncated = f.dir + "/truncated.safetensors";
  const std::string corrupted = f.dir + "/corrupted.safetensors";
  const std::string model_only = f.dir + "/model.safetensors";
  if (f.comm->rank() == 0) {
    std::ifstream in(good, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::ofstream(truncated, std::ios::binary)
        .write(bytes.data(), static_cast<std::streamsize>(bytes.size() / 2));
    std::string bad = bytes;
    bad[3] = '\x7f';  // header length now absurd
    std::ofstream(corrupted, std::ios::binary)
        .write(bad.data(), static_cast<std::streamsize>(bad.size()));
    auto m = make_model("lenet");
    save_model(model_only, *m, {});
  }
  f.comm->barrier("test barrier");
  struct Case {
    std::string file, model, needle;
  } cases[] = {{good, "resnet18", "'lenet' model, not 'resnet18'"},
               {truncated, "lenet", truncated},
               {corrupted, "lenet", "header length"},
               {model_only, "lenet", "not a training checkpoint"},
               {f.dir + "/missing.safetensors", "lenet", "missing.safetensors"}};
  for (const auto& k : cases) {
    TrainConfig r = f.config();
    r.model = k.model;
    r.resume = k.file;
    std::string msg;
    EXPECT_EQ(exit_code_of(r, *f.comm, &msg), 2) << k.file;
    if (f.comm->rank() == 0) {
      EXPECT_NE(msg.find(k.needle), std::string::npos) << msg;
    }
  }
}

}  // namespace
}  // namespace dpt
