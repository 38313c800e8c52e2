#include "llm_engine.h"

#include "checkpoint_dir.h"

#include <graphkeep/core/check.h>
#include <graphkeep/core/stopwatch.h>
#include <graphkeep/reload/served_weights.h>
#include <graphkeep/runtime/device.h>
#include <graphkeep/sources/hf_checkpoint.h>

#include <ATen/ATen.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#ifdef GRAPHKEEP_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <algorithm>
#include <cstdio>

namespace demo {

std::vector<std::int64_t> LlmEngineOptions::default_batch_sizes() {
  std::vector<std::int64_t> s{1, 2, 4};
  for (std::int64_t b = 8; b <= 256; b += 8) s.push_back(b);
  return s;
}

LlmEngine::LlmEngine(const std::string& dir, c10::Device device, WeightFormat format, LlmEngineOptions options)
    : options_(std::move(options)) {
  HfConfig cfg = read_hf_config(dir);
  std::optional<LoraAdapter> adapter = adapter_for(cfg);
  model_ = std::make_shared<CausalLM>(cfg, device, format);
  gk::ReloadReport first;
  {
    auto src = open_checkpoint(dir, *model_);
    first = gk::load_weights(*model_, *with_adapter(*src, adapter), options_.reload.first_load());
  }
  start(first);
}

LlmEngine::LlmEngine(const HfConfig& config, c10::Device device, WeightFormat format, gk::WeightSource& weights,
                     LlmEngineOptions options)
    : options_(std::move(options)) {
  HfConfig cfg = config;
  std::optional<LoraAdapter> adapter = adapter_for(cfg);
  model_ = std::make_shared<CausalLM>(cfg, device, format);
  start(gk::load_weights(*model_, *with_adapter(weights, adapter), options_.reload.first_load()));
}

std::optional<LoraAdapter> LlmEngine::adapter_for(HfConfig& cfg) const {
  if (options_.adapter.empty()) return std::nullopt;
  LoraAdapter a = read_lora_adapter(options_.adapter);
  for (const gk::NamedTensor& t : a.tensors)
    GK_CHECK(gk::WeightError, t.value.scalar_type() == cfg.dtype, a.dir, "/adapter_model.safetensors: tensor '",
             t.name, "' is ", t.value.scalar_type(), " but the model is ", cfg.dtype,
             " (save the adapter in the model's dtype)");
  cfg.adapter = a.config;
  return a;
}

std::unique_ptr<gk::WeightSource> LlmEngine::with_adapter(gk::WeightSource& base,
                                                          const std::optional<LoraAdapter>& first) const {
  return std::make_unique<WithAdapter>(base, first ? first->tensors : std::vector<gk::NamedTensor>{},
                                       first ? "adapter '" + first->dir + "'" : "no adapter");
}

std::unique_ptr<gk::WeightSource> LlmEngine::with_served_adapter(gk::WeightSource& base) const {
  std::vector<gk::NamedTensor> copies = model_->adapter_tensors();
  for (gk::NamedTensor& t : copies) t.value = t.value.clone();  // the reload writes the storage they view
  return std::make_unique<WithAdapter>(base, std::move(copies), "the served adapter");
}

std::optional<c10::StreamGuard> LlmEngine::serving() const {
  if (!serve_stream_) return std::nullopt;
  return std::optional<c10::StreamGuard>(std::in_place, *serve_stream_);
}

void LlmEngine::wait_serving() const {
  if (serve_stream_)
    serve_stream_->synchronize();
  else
    gk::runtime::synchronize(model_->device());
}

void LlmEngine::start(const gk::ReloadReport& first_load) {
  const HfConfig& cfg = model_->config();
  const c10::Device device = model_->device();
#ifdef GRAPHKEEP_WITH_CUDA
  if (device.is_cuda() && options_.high_priority_serving) {
    gk::runtime::synchronize(device);  // the first load ran on the current stream
    serve_stream_ = c10::cuda::getStreamFromPool(/*isHighPriority=*/true, device.index()).unwrap();
  }
#endif
  const auto guard = serving();
  std::sort(options_.batch_sizes.begin(), options_.batch_sizes.end());
  const std::int64_t max_batch = std::max<std::int64_t>(
      {std::int64_t{1}, options_.max_seqs, options_.batch_sizes.empty() ? 0 : options_.batch_sizes.back()});
  GK_CHECK(gk::StateError, options_.max_len > 0 && options_.max_len <= cfg.max_position_embeddings,
           "LlmEngine: max_len ", options_.max_len, " must be in 1..max_position_embeddings (",
           cfg.max_position_embeddings, ")");
  const auto opts = at::TensorOptions().dtype(cfg.dtype).device(device);
  for (std::int64_t l = 0; l < cfg.num_hidden_layers; ++l) {
    const std::vector<std::int64_t> shape{max_batch * options_.max_len, cfg.num_key_value_heads, cfg.head_dim};
    caches_.push_back({at::zeros(shape, opts), at::zeros(shape, opts), options_.max_len});
  }
  rope_ = make_rope_tables(cfg, options_.max_len, device);
  const auto longs = at::TensorOptions().dtype(at::kLong).device(device);
  inputs_ = at::zeros({2, max_batch}, longs);
  ids_ = inputs_.select(0, 0);
  positions_ = inputs_.select(0, 1);
  seqs_ = at::arange(max_batch, longs);
  // Host staging of the inputs and of the token ids: pinned on CUDA, so the
  // copies are asynchronous DMA (Note [Sampling on the device] in sampler.cpp).
  host_inputs_ = at::zeros({2, max_batch}, at::TensorOptions().dtype(at::kLong).pinned_memory(device.is_cuda()));
  host_tokens_ = at::zeros({max_batch}, at::TensorOptions().dtype(at::kInt).pinned_memory(device.is_cuda()));
  sampling_ = SamplingRows::make(max_batch, device);
  model_->set_fast_cuda(options_.fast_cuda);

  engine_ = std::make_unique<gk::ReloadEngine>(*model_, gk::EngineOptions{options_.reload, {}});
  if (first_load.served != nullptr) engine_->prepare(first_load);  // the served content, for patches
  else engine_->prepare();
  for (std::size_t l = 0; l < caches_.size(); ++l) {
    engine_->add_static_io("kv_cache." + std::to_string(l) + ".k", caches_[l].k);
    engine_->add_static_io("kv_cache." + std::to_string(l) + ".v", caches_[l].v);
  }
  engine_->add_static_io("rope.cos", rope_.cos);
  engine_->add_static_io("rope.sin", rope_.sin);
  engine_->add_static_io("input_ids_and_positions", inputs_);
  engine_->add_static_io("seqs", seqs_);
  engine_->add_static_io("sampling.temperature", sampling_.temperature);
  engine_->add_static_io("sampling.top_k", sampling_.top_k);
  engine_->add_static_io("sampling.top_p", sampling_.top_p);
  engine_->add_static_io("sampling.seed", sampling_.seed);
  capture_graphs();
}

LlmEngine::~LlmEngine() {
  for (auto& g : graphs_) engine_->untrack(*g.graph);
}

void LlmEngine::capture_graphs() {
  const gk::Stopwatch watch;
  const c10::Device device = model_->device();
  for (auto& g : graphs_) engine_->untrack(*g.graph);
  graphs_.clear();
  if (!options_.batch_sizes.empty()) {
    positions_.zero_();
    // warm-up outside any capture
    const at::Tensor logits = model_->forward(ids_, {positions_, seqs_}, caches_, rope_);
    (void)greedy_tokens(logits);
    if (options_.sampling_graphs) (void)sample_tokens(logits, positions_, sampling_);
    gk::runtime::synchronize(device);
#if defined(GRAPHKEEP_WITH_CUDA)
    // The graphs allocate from a private pool, which cannot reuse the blocks
    // the loads and PWAL left cached in the default pool: at 30B-A3B shapes
    // those were 71 GiB, and the sampling graphs ran out of memory with the
    // device's memory reserved but unallocated. Hand them back first.
    if (device.is_cuda()) c10::cuda::CUDACachingAllocator::emptyCache();
#endif
  }
  // Largest first, all in the first graph's memory pool (as serving engines
  // capture them): the smaller graphs reuse the larger one's memory.
  for (auto it = options_.batch_sizes.rbegin(); it != options_.batch_sizes.rend(); ++it) {
    const std::int64_t b = *it;
    Graph g{b, gk::make_replay(device, "decode_bs" + std::to_string(b), graphs_.empty() || !options_.shared_pool ? nullptr : graphs_.front().graph.get()), {}, {}, {}, {}};
    const TokenBatch batch{positions_.narrow(0, 0, b), seqs_.narrow(0, 0, b)};
    const at::Tensor ids = ids_.narrow(0, 0, b);
    const std::function<void()> forward = [&] {
      g.logits = model_->forward(ids, batch, caches_, rope_);
      g.greedy = greedy_tokens(g.logits);
    };
    g.graph->capture(forward);
    engine_->track(*g.graph, forward);  // with the forward: Note [Confirming raw addresses]
    // The sampling graph reads the logits of the decode graph as tracked
    // (track() may have captured it again), in the same pool. It reads no
    // weight, so it is not tracked: a reload cannot change what it reads.
    if (options_.sampling_graphs && !sampling_eager_) {
      g.sampler = gk::make_replay(device, "sample_bs" + std::to_string(b), g.graph.get());
      try {
        g.sampler->capture([&] { g.sampled = sample_tokens(g.logits, batch.positions, sampling_.narrow(b)); });
      } catch (const std::exception& e) {
        // Sampling then runs eagerly on the device (decode); greedy
        // decoding, inside the decode graphs, is unaffected.
        const std::string what = e.what();
        std::fprintf(stderr, "LlmEngine: the sampling graph of batch %lld could not be captured (%s); sampling runs "
                     "eagerly on the device\n", static_cast<long long>(b), what.substr(0, what.find('\n')).c_str());
        g.sampler.reset();
        sampling_eager_ = true;
      }
    }
    graphs_.push_back(std::move(g));
  }
  std::reverse(graphs_.begin(), graphs_.end());  // smallest first, for decode_logits()'s search
  gk::runtime::synchronize(device);
  capture_ms_ = watch.elapsed_ms();
}

double LlmEngine::recapture() {
  const auto guard = serving();
  engine_->prepare();
  capture_graphs();
  return capture_ms_;
}

at::Tensor LlmEngine::run_eager(const at::Tensor& ids, const TokenBatch& batch) {
  const auto guard = serving();
  at::Tensor logits = model_->forward(ids, batch, caches_, rope_);
  wait_serving();
  return logits.to(at::kCPU).clone();
}

at::Tensor LlmEngine::prefill(std::int64_t seq, const at::Tensor& tokens, bool checked) {
  const std::int64_t t = tokens.size(0);
  GK_CHECK(gk::StateError, seq >= 0 && seq < ids_.size(0), "prefill: sequence ", seq, " is outside 0..",
           ids_.size(0) - 1);
  GK_CHECK(gk::StateError, t > 0 && t <= options_.max_len, "prefill: ", t, " tokens do not fit max_len ",
           options_.max_len);
  if (checked) engine_->check_replay_allowed();  // the weights must be consistent for eager runs too
  const auto longs = at::TensorOptions().dtype(at::kLong).device(model_->device());
  const TokenBatch batch{at::arange(t, longs), at::full({t}, seq, longs)};
  return run_eager(tokens.to(longs), batch);
}

at::Tensor LlmEngine::decode_eager(const at::Tensor& tokens, const at::Tensor& positions) {
  const auto longs = at::TensorOptions().dtype(at::kLong).device(model_->device());
  const std::int64_t n = tokens.size(0);
  return run_eager(tokens.to(longs), {positions.to(longs), at::arange(n, longs)});
}

LlmEngine::Graph& LlmEngine::prepare_step(const at::Tensor& tokens, const at::Tensor& positions, bool checked) {
  const std::int64_t n = tokens.size(0);
  auto it = std::find_if(graphs_.begin(), graphs_.end(), [&](const Graph& g) { return g.batch >= n; });
  GK_CHECK(gk::StateError, it != graphs_.end(), "decode: a batch of ", n, " exceeds the largest captured graph");
  const at::Tensor ids = tokens.to(at::kCPU, at::kLong).contiguous();
  const at::Tensor pos = positions.to(at::kCPU, at::kLong).contiguous();
  GK_CHECK(gk::StateError, ids.dim() == 1 && pos.dim() == 1 && pos.size(0) == n, "decode: tokens ", tokens.sizes(),
           " and positions ", positions.sizes(), " must both be [", n, "]");
  GK_CHECK(gk::StateError, n == 0 || (pos.min().item<std::int64_t>() >= 0 && pos.max().item<std::int64_t>() < options_.max_len),
           "decode: positions must be [", n, "] and in 0..max_len - 1 (max_len ", options_.max_len, ")");
  GK_CHECK(gk::StateError,
           n == 0 || (ids.min().item<std::int64_t>() >= 0 && ids.max().item<std::int64_t>() < config().vocab_size),
           "decode: token ids must be in 0..", config().vocab_size - 1);
  if (checked) engine_->check_replay_allowed();
  host_inputs_.zero_();
  host_inputs_[0].narrow(0, 0, n).copy_(ids);
  host_inputs_[1].narrow(0, 0, n).copy_(pos);
  inputs_.copy_(host_inputs_, /*non_blocking=*/true);  // on the serving stream: the caller holds serving()
  return *it;
}

at::Tensor LlmEngine::decode_logits(const at::Tensor& tokens, const at::Tensor& positions, bool checked) {
  const auto guard = serving();
  Graph& g = prepare_step(tokens, positions, checked);
  g.graph->replay();
  wait_serving();  // not the device: a stage() may be running on its own stream
  return g.logits.narrow(0, 0, tokens.size(0)).to(at::kCPU).clone();
}

at::Tensor LlmEngine::decode(const at::Tensor& tokens, const at::Tensor& positions, const SamplingParams& params,
                                    bool checked) {
  params.check();
  GK_CHECK(gk::StateError, params.greedy() || options_.sampling_graphs,
           "decode: sampling (temperature ", params.temperature,
           ") needs the sampling graphs (LlmEngineOptions::sampling_graphs)");
  const std::int64_t n = tokens.size(0);
  const auto guard = serving();
  Graph& g = prepare_step(tokens, positions, checked);
  if (!params.greedy() && sampling_set_ != std::make_pair(params, n)) {
    sampling_.set(params, n);
    sampling_set_ = std::make_pair(params, n);
  }
  g.graph->replay();
  if (!params.greedy()) {
    if (g.sampler)
      g.sampler->replay();
    else  // the sampling graphs could not be captured (capture_graphs)
      g.sampled = sample_tokens(g.logits, positions_.narrow(0, 0, g.batch), sampling_.narrow(g.batch));
  }
  const at::Tensor& ids = params.greedy() ? g.greedy : g.sampled;
  host_tokens_.narrow(0, 0, n).copy_(ids.narrow(0, 0, n), /*non_blocking=*/true);
  wait_serving();
  return host_tokens_.narrow(0, 0, n).clone();
}

void LlmEngine::replay_graph(std::int64_t batch) {
  auto it = std::find_if(graphs_.begin(), graphs_.end(), [&](const Graph& g) { return g.batch == batch; });
  GK_CHECK(gk::StateError, it != graphs_.end(), "replay_graph: no decode graph of exactly ", batch, " rows");
  const auto guard = serving();
  it->graph->replay();
}

std::vector<const gk::ReplayBackend*> LlmEngine::decode_graphs() const {
  std::vector<const gk::ReplayBackend*> out;
  for (const Graph& g : graphs_) out.push_back(g.graph.get());
  return out;
}

}  // namespace demo
