// bench_content_hash: the CUDA content hash (gk::content_hashes, Note
// [Summing at memory speed] in hashing/cuda/content_hash.cu) against a
// device copy of the same bytes, measured in the same run.
//
//   bench_content_hash [--out FILE] [--reps N] [--max-gib G]
//                      (default FILE bench_content_hash.json, N 20, G 8)
//
// For each case (total bytes x how they are split into tensors):
//   hash    gk::content_hashes over the tensors: one launch, one sync (the
//           upload of the tensor table and the download of the hashes included)
//   copy    dst.copy_(src) for every tensor, then one device sync: reads and
//           writes the bytes once, so 2 x bytes / time is the DRAM traffic the
//           device sustains; the baseline for "approaching read bandwidth"
// Reported per case: median times, hash_gbps (bytes / hash time), copy_gbps
// (bytes / copy time), copy_traffic_gbps (2 x bytes / copy time), and
// hash_vs_copy_traffic = hash_gbps / copy_traffic_gbps (1.0 means the hash
// reads as fast as the copy moves bytes). The CPU host hash is measured once
// (host_gbps, 256 MiB, all of at::get_num_threads()) for comparison. The
// hashes are checked against the host function once per case (a bench that
// hashes wrongly fast is worthless). Without a CUDA device it prints a message
// and exits 0.
#include <graphkeep/hashing/content_hash.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAFunctions.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

namespace {

double median_seconds(int reps, const std::function<void()>& run) {
  run();  // warm up (allocator, module load)
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    c10::cuda::device_synchronize();
    const auto start = std::chrono::steady_clock::now();
    run();
    c10::cuda::device_synchronize();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

struct Case {
  std::string name;
  std::int64_t total_bytes;
  std::int64_t tensors;  // equal parts (the last takes the remainder)
};

}  // namespace

int main(int argc, char** argv) {
  std::string out = "bench_content_hash.json";
  int reps = 20;
  double max_gib = 8;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--out" && i + 1 < argc) out = argv[++i];
    else if (a == "--reps" && i + 1 < argc) reps = std::atoi(argv[++i]);
    else if (a == "--max-gib" && i + 1 < argc) max_gib = std::atof(argv[++i]);
    else {
      std::fprintf(stderr, "usage: bench_content_hash [--out FILE] [--reps N] [--max-gib G]\n");
      return 1;
    }
  }
  if (!at::hasCUDA() || c10::cuda::device_count() == 0) {
    std::printf("bench_content_hash: no CUDA device; nothing measured\n");
    return 0;
  }
  constexpr std::int64_t MiB = 1 << 20;
  std::vector<Case> cases = {
      {"one tensor", 16 * MiB, 1},           {"one tensor", 64 * MiB, 1},
      {"one tensor", 256 * MiB, 1},          {"one tensor", 1024 * MiB, 1},
      {"one tensor", 4096 * MiB, 1},         {"one tensor", 8192 * MiB, 1},
      {"a layer: 9 tensors", 400 * MiB, 9},  {"a model: 300 tensors", 4096 * MiB, 300},
      {"many small: 4096 tensors", 256 * MiB, 4096},
  };
  nlohmann::json results = nlohmann::json::array();
  for (const Case& c : cases) {
    if (static_cast<double>(c.total_bytes) > max_gib * 1024 * MiB) continue;
    std::vector<at::Tensor> src, dst;
    const std::int64_t part = c.total_bytes / c.tensors;
    for (std::int64_t i = 0; i < c.tensors; ++i) {
      const std::int64_t n = i + 1 < c.tensors ? part : c.total_bytes - part * (c.tensors - 1);
      src.push_back(at::randint(0, 256, {n}, at::TensorOptions().dtype(at::kByte).device(at::kCUDA)));
      dst.push_back(at::empty_like(src.back()));
    }
    // Correctness first: the kernel against the host function.
    std::vector<at::Tensor> host;
    for (const at::Tensor& t : src) host.push_back(t.cpu());
    const bool equal = gk::content_hashes(src) == gk::content_hashes(host);
    host.clear();

    const double hash_s = median_seconds(reps, [&] { (void)gk::content_hashes(src); });
    const double copy_s = median_seconds(reps, [&] {
      for (std::size_t i = 0; i < src.size(); ++i) dst[i].copy_(src[i]);
    });
    const double bytes = static_cast<double>(c.total_bytes);
    nlohmann::json r = {{"case", c.name},
                        {"bytes", c.total_bytes},
                        {"tensors", c.tensors},
                        {"hash_matches_host", equal},
                        {"hash_s", hash_s},
                        {"copy_s", copy_s},
                        {"hash_gbps", bytes / hash_s / 1e9},
                        {"copy_gbps", bytes / copy_s / 1e9},
                        {"copy_traffic_gbps", 2 * bytes / copy_s / 1e9},
                        {"hash_vs_copy_traffic", (bytes / hash_s) / (2 * bytes / copy_s)}};
    std::printf("%-26s %8.0f MiB  hash %8.3f ms %7.1f GB/s   copy %8.3f ms (traffic %7.1f GB/s)   ratio %.2f  %s\n",
                c.name.c_str(), bytes / MiB, hash_s * 1e3, bytes / hash_s / 1e9, copy_s * 1e3,
                2 * bytes / copy_s / 1e9, (bytes / hash_s) / (2 * bytes / copy_s), equal ? "ok" : "MISMATCH");
    results.push_back(r);
  }
  // The host function, for comparison.
  const at::Tensor h = at::randint(0, 256, {256 * MiB}, at::TensorOptions().dtype(at::kByte));
  const double host_s = median_seconds(std::max(3, reps / 4), [&] { (void)gk::content_hash(h); });
  std::printf("host (CPU, %d threads)      256 MiB  hash %8.3f ms %7.1f GB/s\n", at::get_num_threads(), host_s * 1e3,
              256.0 * MiB / host_s / 1e9);

  nlohmann::json doc = {{"bench", "content_hash"},
                        {"function", std::string(gk::kContentHashName)},
                        {"device", std::string(at::cuda::getDeviceProperties(0)->name)},
                        {"reps", reps},
                        {"host_threads", at::get_num_threads()},
                        {"host_gbps", 256.0 * MiB / host_s / 1e9},
                        {"cases", results}};
  std::ofstream(out) << doc.dump(2) << '\n';
  std::printf("wrote %s\n", out.c_str());
  bool all_equal = true;
  for (const auto& r : results) all_equal = all_equal && r["hash_matches_host"].get<bool>();
  return all_equal ? 0 : 1;
}
