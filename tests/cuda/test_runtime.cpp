// The CUDA device runtime (core/cuda.h): availability, the caching allocator, copies,
// streams and events. Without a GPU, the tests check that every entry point says why it
// cannot work; with one, that it does.
#include <thread>

#include "cuda/cuda_testing.h"

using namespace kiln;

TEST_CASE("without a GPU the CUDA runtime says why", "[cuda]") {
  if (cuda::is_available()) {
    WARN("skipped: this machine has a GPU");
    return;
  }
  CHECK(cuda::device_count() == 0);
  CHECK_FALSE(cuda::unavailable_reason().empty());
  CHECK_THROWS_WITH(zeros({2}, {.device = Device::cuda(0)}),
                    Catch::Contains("cuda:0 is not available") && Catch::Contains(cuda::unavailable_reason()));
  CHECK_THROWS_WITH(from_vector<float>({1, 2}).to(Device::cuda()), Catch::Contains("not available"));
  CHECK_THROWS_WITH(cuda::synchronize(), Catch::Contains("cuda::synchronize"));
  CHECK_THROWS_WITH(cuda::set_device(0), Catch::Contains("cuda::set_device: cuda:0 is not available"));
  CHECK_THROWS_AS(cuda::current_stream(), Error);
  CHECK_THROWS_AS(cuda::Event(), Error);
  CHECK(cuda::memory_summary().find("not available") != std::string::npos);
  CHECK(cuda::allocator_stats().allocations == 0);
  cuda::empty_cache();  // a no-op, not an error
  CHECK_THROWS_WITH(cuda::pin_memory(ones({3})), Catch::Contains("cuda::") && Catch::Contains("not available"));
  CHECK_THROWS_WITH(cuda::empty_pinned({3}, DType::f32), Catch::Contains("not available"));
  CHECK_FALSE(cuda::is_pinned(ones({3})));
}

TEST_CASE("pinned host memory copies to the GPU and is reused only after its copies", "[cuda]") {
  KILN_NEEDS_GPU();
  const Tensor x = randn({1000, 33});
  const Tensor p = cuda::pin_memory(x);
  CHECK(cuda::is_pinned(p));
  CHECK(cuda::is_pinned(p[3]));  // a view of it too
  CHECK_FALSE(cuda::is_pinned(x));
  KILN_CHECK_EQUAL(p, x);
  KILN_CHECK_EQUAL(testing::host(p.to(Device::cuda())), x);
  CHECK_THROWS_WITH(cuda::pin_memory(zeros({2}, {.device = Device::cuda()})), Catch::Contains("expects a CPU tensor"));
  // Batches as a loader makes them: fill a pinned buffer, copy it (asynchronously), drop it,
  // at once, twenty times over; the freed blocks come back only once their copy has run, so
  // every device copy holds its own batch.
  std::vector<Tensor> on_gpu, expected;
  for (int i = 0; i < 20; ++i) {
    Tensor batch = cuda::empty_pinned({64, 1000}, DType::f32);
    batch.copy_(full({64, 1000}, static_cast<double>(i)));
    on_gpu.push_back(batch.to(Device::cuda()));
    expected.push_back(full({64, 1000}, static_cast<double>(i)));
  }
  for (size_t i = 0; i < on_gpu.size(); ++i) KILN_CHECK_EQUAL(testing::host(on_gpu[i]), expected[i]);
  // With the stream busy (a few large products queued first), a block freed right after its
  // copy was queued is not handed out again until the copy has run.
  cuda::synchronize();
  const Tensor big = randn({4096, 4096}).to(Device::cuda());
  Tensor busy = big;
  for (int i = 0; i < 8; ++i) busy = matmul(busy, big) * 1e-3;
  Tensor first = cuda::empty_pinned({1 << 20}, DType::f32);
  const void* address = first.data_ptr();
  first.fill_(3);
  const Tensor copied = first.to(Device::cuda());
  first = Tensor();  // freed with its copy (most likely) still queued behind the products
  const Tensor second = cuda::empty_pinned({1 << 20}, DType::f32);
  INFO("the first block " << (second.data_ptr() == address ? "was" : "was not") << " handed out again at once");
  cuda::synchronize();
  KILN_CHECK_EQUAL(testing::host(copied), full({1 << 20}, 3.0));
  const Tensor third = cuda::empty_pinned({1 << 20}, DType::f32);
  CHECK((third.data_ptr() == address || second.data_ptr() == address));  // reused once the copy ran
  CHECK(cuda::memory_summary().find("pinned host memory") != std::string::npos);
  // A view in the middle of a block copies (and is tracked) like the block.
  const Tensor rows = cuda::pin_memory(arange(0, 1000, 1, {.dtype = DType::f32}).reshape({10, 100}));
  KILN_CHECK_EQUAL(testing::host(rows[4].to(Device::cuda())), arange(400, 500, 1, {.dtype = DType::f32}));
}

TEST_CASE("cuda::set_device picks the process's GPU, and pinned memory from any thread works with it", "[cuda]") {
  KILN_NEEDS_GPU();
  CHECK_THROWS_WITH(cuda::set_device(cuda::device_count()), Catch::Contains("is not available: this machine has"));
  // The last GPU, as a data-parallel rank's: pinned batches made on a worker thread (whose
  // current device is cuda:0 unless set) copy there and come back unchanged.
  const int last = cuda::device_count() - 1;
  const Device gpu = Device::cuda(last);
  cuda::set_device(last);
  Tensor batch;
  std::thread worker([&] {
    batch = cuda::empty_pinned({256, 100}, DType::f32);
    batch.copy_(arange(0, 25600, 1, {.dtype = DType::f32}).reshape({256, 100}));
  });
  worker.join();
  CHECK(cuda::is_pinned(batch));
  const Tensor on_gpu = batch.to(gpu);
  batch = Tensor();  // freed (on this thread) while its copy may still run
  KILN_CHECK_EQUAL(testing::host(on_gpu), arange(0, 25600, 1, {.dtype = DType::f32}).reshape({256, 100}));
  CHECK(on_gpu.device() == gpu);
  cuda::set_device(0);
}

TEST_CASE("CUDA devices report their properties", "[cuda]") {
  KILN_NEEDS_GPU();
  CHECK(cuda::device_count() >= 1);
  const cuda::DeviceProperties p = cuda::device_properties(0);
  INFO(p.name << " " << p.arch());
  CHECK(p.major >= 7);
  CHECK(p.multiprocessors > 0);
  CHECK(p.total_memory > 0);
  CHECK_THROWS_WITH(zeros({2}, {.device = Device::cuda(cuda::device_count())}),
                    Catch::Contains("is not available: this machine has"));
}

TEST_CASE("tensors go to the GPU and back unchanged in every dtype", "[cuda]") {
  KILN_NEEDS_GPU();
  for (DType dt : {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i64, DType::i32, DType::u8,
                   DType::boolean}) {
    INFO(name(dt));
    const Tensor cpu = (arange(0, 1000, 1, {.dtype = DType::f32}) * 0.25).to(dt).reshape({10, 100});
    const Tensor gpu = cpu.to(Device::cuda());
    CHECK(gpu.device() == Device::cuda(0));
    CHECK(gpu.shape() == cpu.shape());
    CHECK(gpu.dtype() == dt);
    const Tensor back = gpu.to(Device::cpu());
    CHECK(std::memcmp(back.data_ptr(), cpu.data_ptr(), static_cast<size_t>(cpu.numel()) * cpu.itemsize()) == 0);
    // A GPU to GPU copy, and item() through the host.
    CHECK(gpu.to(Device::cuda()).same(gpu));
    CHECK(gpu[3][4].item().to_double() == cpu[3][4].item().to_double());
  }
  // Empty tensors and 0-d tensors.
  CHECK(zeros({0, 3}).to(Device::cuda()).to(Device::cpu()).shape() == Shape{0, 3});
  CHECK(full({}, 2.5, {.dtype = DType::f64}).to(Device::cuda()).item<double>() == 2.5);
  // copy_ across devices converts on the target.
  Tensor host = zeros({4}, {.dtype = DType::f32});
  const Tensor gpu = from_vector<float>({1, 2, 3, 4}).to(Device::cuda());
  host.copy_(gpu);
  CHECK(host[2].item<float>() == 3.0f);
}

TEST_CASE("the caching allocator reuses freed blocks and counts them", "[cuda]") {
  KILN_NEEDS_GPU();
  cuda::synchronize();
  const cuda::AllocatorStats before = cuda::allocator_stats();
  { Tensor a = empty({1000}, {.device = Device::cuda()}); }  // 4000 bytes: a 4096-byte class
  const cuda::AllocatorStats mid = cuda::allocator_stats();
  CHECK(mid.allocations == before.allocations + 1);
  CHECK(mid.allocated == before.allocated);
  { Tensor b = empty({1010}, {.device = Device::cuda()}); }  // the same class: from the cache
  const cuda::AllocatorStats after = cuda::allocator_stats();
  CHECK(after.cache_hits == mid.cache_hits + 1);
  CHECK(after.cuda_mallocs == mid.cuda_mallocs);
  CHECK(after.reserved >= after.allocated);
  CHECK(memory_stats(DeviceType::cuda).allocated >= 0);
  const std::string summary = cuda::memory_summary();
  INFO(summary);
  CHECK(summary.find("reserved from CUDA") != std::string::npos);
  cuda::empty_cache();
  CHECK(cuda::allocator_stats().reserved == cuda::allocator_stats().allocated);
}

TEST_CASE("an allocation larger than the GPU is a kiln::Error and the process goes on", "[cuda]") {
  KILN_NEEDS_GPU();
  const int64_t too_many = cuda::device_properties(0).total_memory;  // f32: four times the memory
  CHECK_THROWS_WITH(empty({too_many}, {.device = Device::cuda()}),
                    Catch::Contains("CUDA out of memory") && Catch::Contains("cuda:0"));
  CHECK(zeros({4}).to(Device::cuda()).to(Device::cpu())[3].item<float>() == 0.0f);
}

TEST_CASE("streams order work and events time it", "[cuda]") {
  KILN_NEEDS_GPU();
  const cuda::Stream main = cuda::current_stream();
  const cuda::Stream side = cuda::new_stream();
  CHECK_FALSE(side == main);
  {
    cuda::StreamGuard guard(side);
    CHECK(cuda::current_stream() == side);
    cuda::Event start, stop;
    start.record();
    const Tensor x = ones({1 << 20}).to(Device::cuda());
    stop.record();
    stop.synchronize();
    CHECK(stop.elapsed_ms(start) >= 0.0f);
    CHECK(x.to(Device::cpu())[12345].item<float>() == 1.0f);
  }
  CHECK(cuda::current_stream() == main);
  cuda::synchronize();
}
