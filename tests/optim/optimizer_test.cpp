#include "optim/optimizer.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace lockstep::optim {
namespace {

TEST(Schedule, LinearWarmupThenCosineToZero) {
  ScheduleSpec spec{0.1, 10, 110, "cosine"};
  EXPECT_NEAR(scheduled_lr(spec, 0), 0.01, 1e-12);
  EXPECT_NEAR(scheduled_lr(spec, 9), 0.1, 1e-12);
  EXPECT_NEAR(scheduled_lr(spec, 10), 0.1, 1e-12);
  EXPECT_NEAR(scheduled_lr(spec, 60), 0.05, 1e-12);
  EXPECT_NEAR(scheduled_lr(spec, 110), 0.0, 1e-12);
  ScheduleSpec constant{0.1, 0, 100, "constant"};
  EXPECT_EQ(scheduled_lr(constant, 99), 0.1);
}

// Three parameters in one flat segment, the same three as ordinary tensors
// for LibTorch's optimizer; the same gradients for 6 steps; the flat update
// must match LibTorch's per-tensor one.
struct FlatAndReference {
  at::Tensor flat_params, flat_grads;
  std::vector<at::Tensor> reference;
  explicit FlatAndReference(uint64_t seed) {
    torch::manual_seed(seed);
    flat_params = torch::randn({3 * 4 + 5});
    flat_grads = torch::zeros_like(flat_params);
    for (auto [offset, length] : {std::pair{0, 12}, std::pair{12, 5}})
      reference.push_back(flat_params.narrow(0, offset, length).clone().requires_grad_());
  }
  void set_gradients(int step) {
    torch::manual_seed(100 + step);
    flat_grads.copy_(torch::randn_like(flat_grads));
    reference[0].mutable_grad() = flat_grads.narrow(0, 0, 12).clone();
    reference[1].mutable_grad() = flat_grads.narrow(0, 12, 5).clone();
  }
  at::Tensor reference_flat() { return torch::cat({reference[0], reference[1]}).detach(); }
};

TEST(Optimizer, FlatSgdMatchesLibTorchSgd) {
  FlatAndReference state(1);
  OptimizerSpec spec{"sgd", 0.1, 0.9, 0.01};
  auto ours = make_optimizer({{state.flat_params, state.flat_grads}}, spec);
  torch::optim::SGD theirs(state.reference,
                           torch::optim::SGDOptions(0.1).momentum(0.9).weight_decay(0.01));
  for (int step = 0; step < 6; ++step) {
    state.set_gradients(step);
    ours->step();
    theirs.step();
    EXPECT_TRUE(state.flat_params.allclose(state.reference_flat(), 1e-6, 1e-7)) << "step " << step;
  }
  EXPECT_EQ(ours->steps_taken(), 6);
}

TEST(Optimizer, FlatAdamwMatchesLibTorchAdamw) {
  FlatAndReference state(2);
  OptimizerSpec spec{"adamw", 0.01, 0.0, 0.05};
  auto ours = make_optimizer({{state.flat_params, state.flat_grads}}, spec);
  torch::optim::AdamW theirs(state.reference, torch::optim::AdamWOptions(0.01).weight_decay(0.05));
  for (int step = 0; step < 6; ++step) {
    state.set_gradients(step);
    ours->step();
    theirs.step();
    EXPECT_TRUE(state.flat_params.allclose(state.reference_flat(), 1e-6, 1e-7)) << "step " << step;
  }
}

// The same check for the rest: Nesterov SGD, Adam (L2 weight decay) and
// RMSprop with and without momentum, each against LibTorch's own.
template <typename Reference>
void expect_matches(const OptimizerSpec& spec, Reference& theirs, FlatAndReference& state) {
  auto ours = make_optimizer({{state.flat_params, state.flat_grads}}, spec);
  for (int step = 0; step < 6; ++step) {
    state.set_gradients(step);
    ours->step();
    theirs.step();
    EXPECT_TRUE(state.flat_params.allclose(state.reference_flat(), 1e-6, 1e-7))
        << spec.name << " step " << step;
  }
}

TEST(Optimizer, FlatNesterovSgdMatchesLibTorch) {
  FlatAndReference state(5);
  OptimizerSpec spec{"sgd", 0.1, 0.9, 0.01};
  spec.nesterov = true;
  torch::optim::SGD theirs(state.reference,
                           torch::optim::SGDOptions(0.1).momentum(0.9).weight_decay(0.01).nesterov(true));
  expect_matches(spec, theirs, state);
}

TEST(Optimizer, FlatAdamMatchesLibTorchAdam) {
  FlatAndReference state(6);
  OptimizerSpec spec{"adam", 0.01, 0.0, 0.05};
  torch::optim::Adam theirs(state.reference, torch::optim::AdamOptions(0.01).weight_decay(0.05));
  expect_matches(spec, theirs, state);
}

TEST(Optimizer, FlatRmspropMatchesLibTorchRmsprop) {
  for (double momentum : {0.0, 0.9}) {
    FlatAndReference state(7);
    OptimizerSpec spec{"rmsprop", 0.01, momentum, 0.02};
    torch::optim::RMSprop theirs(
        state.reference,
        torch::optim::RMSpropOptions(0.01).momentum(momentum).weight_decay(0.02).alpha(0.99).eps(1e-8));
    expect_matches(spec, theirs, state);
  }
}

// Saved state loaded into a fresh optimizer continues bit for bit.
TEST(Optimizer, SaveAndLoadContinueBitForBit) {
  for (const char* name : {"sgd", "adamw", "adam", "rmsprop"}) {
    FlatAndReference a(3), b(3);
    OptimizerSpec spec{name, 0.05, 0.9, 0.0};
    auto first = make_optimizer({{a.flat_params, a.flat_grads}}, spec);
    for (int step = 0; step < 3; ++step) {
      a.set_gradients(step);
      first->step();
    }
    auto second = make_optimizer({{b.flat_params, b.flat_grads}}, spec);
    b.flat_params.copy_(a.flat_params);
    second->load_from_bytes(first->save_to_bytes());
    EXPECT_EQ(second->steps_taken(), 3) << name;
    for (int step = 3; step < 6; ++step) {
      a.set_gradients(step);
      b.set_gradients(step);
      first->step();
      second->step();
    }
    EXPECT_TRUE(a.flat_params.equal(b.flat_params)) << name;
  }
}

TEST(Optimizer, RefusesStateOfAnotherKindOrLayoutAndUnknownNames) {
  FlatAndReference a(4);
  auto sgd = make_optimizer({{a.flat_params, a.flat_grads}}, {"sgd", 0.1, 0.9, 0.0});
  auto adamw = make_optimizer({{a.flat_params, a.flat_grads}}, {"adamw", 0.1, 0.9, 0.0});
  try {
    adamw->load_from_bytes(sgd->save_to_bytes());
    ADD_FAILURE() << "loaded sgd state into adamw";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("optim.name"), std::string::npos) << e.what();
  }
  auto two = make_optimizer({{a.flat_params.narrow(0, 0, 5), a.flat_grads.narrow(0, 0, 5)},
                             {a.flat_params.narrow(0, 5, 12), a.flat_grads.narrow(0, 5, 12)}},
                            {"sgd", 0.1, 0.9, 0.0});
  EXPECT_THROW(two->load_from_bytes(sgd->save_to_bytes()), std::invalid_argument);
  sgd->set_lr(0.25);
  EXPECT_EQ(sgd->lr(), 0.25);
  EXPECT_THROW(make_optimizer({{a.flat_params, a.flat_grads}}, {"lion", 0.1, 0.9, 0.0}),
               std::invalid_argument);
  EXPECT_THROW(make_optimizer({{a.flat_params, a.flat_grads.narrow(0, 0, 3)}}, {"sgd", 0.1, 0.9, 0.0}),
               std::invalid_argument);
}

}  // namespace
}  // namespace lockstep::optim
