// `megatron serve --load DIR [--host H --port P ...]`: an HTTP server over a loaded model
// (server.h). Loads the model, then serves until SIGTERM/SIGINT, exiting 0 after a drain.
// `megatron launch --nproc-per-node N -- serve --tensor-model-parallel-size N ...`: rank 0 serves
// HTTP and drives the engines of every rank (step_work.h); the others step theirs as it says.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <thread>

#include "comm/env.h"
#include "comm/world.h"
#include "core/error.h"
#include "core/log.h"
#include "kernels/cpu/threads.h"
#include "kernels/device.h"
#include "serve/cpu_backend.h"
#include "serve/engine_backend.h"
#include "serve/server.h"
#include "serve/step_work.h"
#include "training/commands.h"
#include "training/flag_parser.h"
#include "training/generation_model.h"
#include "training/inference_load.h"

namespace mt {

namespace {

// A rank of a tensor-parallel server that is still running `seconds` after a stop signal (a
// peer stuck in a collective, rank 0 gone quiet) exits anyway: no wait is left unbounded.
void exit_after_stop_signal(double seconds) {
  std::thread([seconds] {
    while (serve::stop_signal() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
    std::fprintf(stderr, "megatron serve: still running %.0f s after the stop signal; exiting\n", seconds);
    std::fflush(stderr);
    std::_Exit(1);
  }).detach();
}

}  // namespace

int serve_main(const std::vector<std::string>& argv) {
  std::string load, device = "cpu", fp8_format;
  int64_t iteration = -1, threads = 0, port = 5000, max_prompt = 0, max_new = 0, tp = 1;
  double timeout_minutes = 10;
  bool engine = false, cuda_graphs = false;
  serve::ServerOptions o;
  FlagParser p("serve");
  p.value("--load", &load, "checkpoint directory (as --save wrote it) or HuggingFace model directory");
  p.value("--iteration", &iteration, "which saved iteration (default: the latest)", {0, INT64_MAX});
  p.value("--device", &device,
          "where to generate: cpu (default, fp32), cuda (bf16, through the generation engine) or auto (cuda where a "
          "GPU is visible)",
          {"cpu", "cuda", "auto"});
  p.store_true("--engine",
               &engine, "on the CPU too, generate through the engine (KV cache, concurrent requests batched into one "
                        "pass); the GPU and --tensor-model-parallel-size > 1 always do");
  p.store_true("--cuda-graphs", &cuda_graphs, "on the GPU, replay each decode step as one CUDA graph");
  p.value("--fp8-format", &fp8_format, std::string(kFp8InferenceHelp) + " (runs through the engine)", {"e4m3", "hybrid"});
  p.value("--host", &o.host, "address to listen on (default 127.0.0.1: this machine only; 0.0.0.0: every interface)");
  p.value("--port", &port, "port to listen on (default 5000, as Megatron's server; 0: any free port, printed)",
          {0, 65535});
  p.value("--max-prompt-tokens", &max_prompt, "longest prompt accepted, in tokens (default: the model's context)",
          {1, INT64_MAX});
  p.value("--max-tokens-to-generate", &max_new, "most tokens generated per prompt (default: the model's context)",
          {1, INT64_MAX});
  p.value("--max-body-bytes", &o.max_body_bytes, "largest request body (default 1 MiB; larger: 413)",
          {1024, int64_t{1} << 30});
  p.value("--max-concurrent-requests", &o.max_concurrent,
          "requests admitted at once, running or queued for the model (default 8; more: 503)", {1, 1024});
  p.value("--request-timeout", &o.request_timeout_s, "seconds a request may take, queueing included (default 600; 504)");
  p.value("--shutdown-timeout", &o.shutdown_timeout_s,
          "seconds in-flight requests may take to finish after SIGTERM before they are cancelled (default 10)");
  p.value("--model-name", &o.model_name, "the model's name in responses (default: the --load directory's name)");
  p.value("--num-threads", &threads, "CPU threads (default: all cores)", {0, kMaxThreads});
  p.value("--tensor-model-parallel-size", &tp,
          "split the model over this many ranks (start them with megatron launch --nproc-per-node N -- serve ...; "
          "rank 0 serves HTTP); a native checkpoint of any layout is resharded on load; always the engine",
          {1, 1024});
  p.value("--distributed-timeout-minutes", &timeout_minutes,
          "with --tensor-model-parallel-size: how long a rank waits on the others before failing (default 10)");
  p.parse(argv);
  if (p.help_requested()) {
    std::fputs(p.help().c_str(), stdout);
    return 0;
  }
  if (load.empty()) fail("--load DIR is required");
  if (device == "auto") device = ops::gpu_count() > 0 ? "cuda" : "cpu";
  if (device == "cuda" && ops::gpu_count() == 0)
    fail("--device cuda: no GPU is visible to this process (CUDA_VISIBLE_DEVICES, the driver, or a build without "
         "CUDA); use --device cpu");
  // FP8 weights live in the engine's model; TP ranks step engines in lockstep.
  if (device == "cuda" || !fp8_format.empty() || tp > 1) engine = true;
  if (!(timeout_minutes > 0)) fail("--distributed-timeout-minutes must be > 0 (got {})", timeout_minutes);
  // The ranks of a tensor-parallel server: rank 0 answers HTTP, every rank steps an engine.
  const comm::DistEnv env = comm::detect_dist_env();
  if (env.world_size != tp)
    fail("--tensor-model-parallel-size {} runs as {} ranks, but this job has {} (start it with megatron launch "
         "--nproc-per-node {} -- serve ...)",
         tp, tp, env.world_size, tp);
  set_log_rank(env.rank);
  if (cuda_graphs && device != "cuda") fail("--cuda-graphs needs --device cuda (graphs replay GPU decode steps)");
  if (!serve::http_server_available())
    fail("serve: this build has no HTTP server library; install libcpp-httplib-dev (scripts/install_deps.sh) and "
         "rebuild");
  if (!(o.request_timeout_s > 0)) fail("--request-timeout must be > 0 seconds (got {})", o.request_timeout_s);
  if (!(o.shutdown_timeout_s >= 0)) fail("--shutdown-timeout must be >= 0 seconds (got {})", o.shutdown_timeout_s);
  o.port = static_cast<int>(port);
  if (o.model_name.empty()) o.model_name = std::filesystem::path(load).lexically_normal().filename().string();
  if (o.model_name.empty()) o.model_name = std::filesystem::path(load).lexically_normal().parent_path().filename().string();
  cpu::set_num_threads(static_cast<int>(threads));

  const std::optional<int64_t> it = iteration >= 0 ? std::optional<int64_t>(iteration) : std::nullopt;
  GenerationModel g = read_generation_model(load, it);
  const int64_t context = g.context();
  if (max_prompt > context)
    fail("--max-prompt-tokens {} exceeds the model's context of {} tokens: use {} or less", max_prompt, context, context);
  if (max_new > context)
    fail("--max-tokens-to-generate {} exceeds the model's context of {} tokens: use {} or less", max_new, context,
         context);
  o.limits.context = context;
  o.limits.max_prompt_tokens = max_prompt > 0 ? max_prompt : context;
  o.limits.max_tokens = max_new > 0 ? max_new : context;
  o.limits.vocab = g.vocab();
  if (!engine) {
    build_generation_model(g, load, it);
    serve::CpuBackend backend(std::move(g));
    serve::run_server(backend, o);
    return 0;
  }
  // The engine: a KV cache slot per admitted request, so that every request admitted can run at
  // once; prompt chunks of up to the context per pass.
  InferenceRanks ranks;  // outlives the model
  open_inference_ranks(ranks, env, device, tp, std::chrono::milliseconds(static_cast<int64_t>(timeout_minutes * 60000)));
  if (ranks.world) {
    // Rank 0 drains for at most --shutdown-timeout, then waits 30 s for what it cancelled.
    exit_after_stop_signal(o.shutdown_timeout_s + 60);
  }
  comm::Communicator* tp_comm = ranks.tp();
  InferenceModel im = load_inference_model(load, iteration, device == "cuda" ? Device::CUDA : Device::CPU, true, tp_comm,
                                           !fp8_format.empty());
  inference::EngineOptions eo;
  eo.max_batch = o.max_concurrent;
  eo.max_seq_len = context;
  eo.max_step_tokens = std::max<int64_t>(context, o.max_concurrent);
  eo.cuda_graphs = cuda_graphs;
  if (ranks.world && env.rank != 0) {
    inference::Engine engine(*im.model, eo);
    serve::install_stop_handlers();  // a signal ends this rank when rank 0 says so, after its drain
    serve::follow_engine(engine, *tp_comm);
  } else {
    serve::EngineBackend backend(std::move(im), eo, tp_comm);
    serve::run_server(backend, o);
  }  // rank 0's backend tells the others to stop as it goes
  if (ranks.world) ranks.world->shutdown();
  return 0;
}

}  // namespace mt
