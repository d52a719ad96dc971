// `megatron generate`: text from a checkpoint or HuggingFace model, through the generation engine
// (src/inference: KV cache, continuous batching) on the CPU or the GPU. --prompt prints the prompt
// and its continuation; --prompts-file reads JSONL ({"prompt": ...} per line) and writes one JSON
// object per prompt, in input order.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <optional>

#include <nlohmann/json.hpp>

#include "comm/env.h"
#include "comm/world.h"
#include "core/error.h"
#include "core/log.h"
#include "core/error_report.h"
#include "inference/engine.h"
#include "kernels/cpu/threads.h"
#include "kernels/device.h"
#include "training/commands.h"
#include "training/flag_parser.h"
#include "training/generate_prompts.h"
#include "training/inference_load.h"

namespace mt {

namespace {

// The continuation as text that joins the prompt the way the tokenizer would: decoding the
// generated ids alone loses the separator between the last prompt token and the first new one
// (the Null tokenizer's "... 8" + "9 10" printed "... 89 10"), so the whole sequence is decoded
// and the prompt's own decoding cut off its front. Where a tokenizer's decoding of the prompt is
// not a prefix of the whole (a byte-level merge across the boundary), the generated ids are
// decoded alone, as before.
std::string continuation(const data::Tokenizer& tok, const std::vector<int32_t>& prompt,
                         const std::vector<int32_t>& gen, bool empty_prompt) {
  if (empty_prompt) return tok.decode(gen);  // nothing printed before it to join
  std::vector<int32_t> ids = prompt;
  ids.insert(ids.end(), gen.begin(), gen.end());
  const std::string whole = tok.decode(ids), prefix = tok.decode(prompt);
  if (whole.compare(0, prefix.size(), prefix) == 0) return whole.substr(prefix.size());
  return tok.decode(gen);
}

struct Job {
  std::string prompt;
  std::vector<int32_t> ids;
  inference::Completion result;
};

}  // namespace

int generate_main(const std::vector<std::string>& argv) {
  std::string load, prompt, prompts_file, output, device = "auto", fp8_format;
  int64_t max_new = 64, top_k = 0, threads = 0, iteration = -1, max_batch = 8, tp = 1;
  float temperature = 1.0f, top_p = 1.0f;
  uint64_t seed = 1234;
  std::vector<std::string> stops;
  bool cuda_graphs = false;
  FlagParser p("generate");
  p.value("--load", &load, "checkpoint directory (as given to pretrain --save) or HuggingFace model directory");
  p.value("--iteration", &iteration, "which saved iteration of a checkpoint (default: the latest)", {0, INT64_MAX});
  p.value("--device", &device, "where to run: cpu (fp32), cuda (bf16), or auto (cuda where a GPU is visible)",
          {"auto", "cpu", "cuda"});
  p.value("--prompt", &prompt, "text to continue (printed with its continuation)");
  p.value("--prompts-file", &prompts_file,
          "JSONL, one {\"prompt\": ...} per line (optional per-line max_new_tokens, temperature, top_k, top_p, seed, "
          "stop); writes one JSON object per prompt");
  p.value("--output", &output, "with --prompts-file: write the JSONL results here (default: stdout)");
  // Bounded by the model's context below, once the prompt's length is known.
  p.value("--max-new-tokens", &max_new,
          "tokens to generate (default: 64, or what the context leaves; prompt + new tokens must fit the context)",
          {0, INT64_MAX});
  p.value("--temperature", &temperature, "sampling temperature (0 = greedy; default 1.0)");
  p.value("--top-k", &top_k, "keep the k most likely tokens (0 = all)", {0, model::limits::kVocab});
  p.value("--top-p", &top_p, "nucleus sampling: keep the most likely tokens whose probabilities sum to p, in (0, 1] "
                             "(default 1 = all)");
  p.value("--seed", &seed, "sampling seed (default 1234; each prompt's output depends only on it)");
  p.list("--stop", &stops, "stop strings: generation ends once the output contains one (the text is cut before it)");
  p.value("--max-batch", &max_batch, "prompts generated at once (KV cache slots; default 8)", {1, 4096});
  p.store_true("--cuda-graphs", &cuda_graphs, "on the GPU, replay each decode step as one CUDA graph");
  p.value("--fp8-format", &fp8_format, kFp8InferenceHelp, {"e4m3", "hybrid"});
  p.value("--num-threads", &threads, "CPU threads (default: all cores)", {0, kMaxThreads});
  p.value("--tensor-model-parallel-size", &tp,
          "split the model over this many ranks (start them with megatron launch --nproc-per-node N -- generate ...; "
          "rank 0 prints); a native checkpoint of any layout is resharded on load",
          {1, 1024});
  p.parse(argv);
  if (p.help_requested()) {
    std::fputs(p.help().c_str(), stdout);
    return 0;
  }
  if (load.empty()) fail("--load DIR is required");
  if (!prompts_file.empty() && p.given("--prompt"))
    fail("--prompt and --prompts-file are alternatives: give one");
  if (!output.empty() && prompts_file.empty()) fail("--output goes with --prompts-file (--prompt prints to stdout)");
  inference::SamplingParams base{temperature, top_k, top_p, seed};
  inference::check_sampling(base);
  cpu::set_num_threads(static_cast<int>(threads));
  std::vector<PromptLine> lines;
  if (!prompts_file.empty()) lines = read_prompts_file(prompts_file);

  if (device == "auto") device = ops::gpu_count() > 0 ? "cuda" : "cpu";
  // The ranks of a tensor-parallel generation: every rank reads the same prompts and steps its
  // engine in the same order (the gathered logits give them the same tokens); rank 0 prints.
  const comm::DistEnv env = comm::detect_dist_env();
  if (env.world_size != tp)
    fail("--tensor-model-parallel-size {} runs as {} ranks, but this job has {} (start it with megatron launch "
         "--nproc-per-node {} -- generate ...)",
         tp, tp, env.world_size, tp);
  set_log_rank(env.rank);
  InferenceRanks ranks;  // outlives the model
  open_inference_ranks(ranks, env, device, tp, std::chrono::minutes(10));
  const Device dev = device == "cuda" ? Device::CUDA : Device::CPU;
  std::optional<Activity> building(std::in_place, "loading the model");
  InferenceModel im = load_inference_model(load, iteration, dev, true, ranks.tp(), !fp8_format.empty());
  building.reset();
  const data::Tokenizer& tok = *im.tokenizer;
  const int64_t S = im.args.model.seq_length;

  inference::EngineOptions eo;
  eo.max_batch = max_batch;
  eo.max_seq_len = S;
  eo.max_step_tokens = std::max<int64_t>(S, max_batch);
  eo.cuda_graphs = cuda_graphs;
  eo.decode = [&tok](const std::vector<int32_t>& ids) { return tok.decode(ids); };
  inference::Engine engine(*im.model, eo);

  const bool single = prompts_file.empty();
  if (single) lines.push_back(PromptLine{prompt, {}, {}, {}, {}, {}, {}});
  std::vector<Job> jobs(lines.size());
  for (size_t i = 0; i < lines.size(); ++i) {
    const PromptLine& l = lines[i];
    // Messages name the flag for --prompt, the file and line for --prompts-file.
    const std::string what = single ? "--prompt" : prompts_file + " prompt " + std::to_string(i + 1);
    Job& j = jobs[i];
    j.prompt = l.prompt;
    j.ids = tok.encode(l.prompt);
    if (j.ids.empty()) j.ids.push_back(tok.eod());  // start a fresh document
    const int64_t n = static_cast<int64_t>(j.ids.size());
    // Megatron refuses prompt + tokens to generate beyond the model's context rather than
    // sliding a window the model was never trained on (or dropping the prompt's start).
    if (n > S) fail("{} is {} tokens but the model's context is {} (its --seq-length): shorten the prompt", what, n, S);
    int64_t mn = l.max_new_tokens.value_or(max_new);
    if (!l.max_new_tokens && !p.given("--max-new-tokens")) mn = std::min(mn, S - n);  // the default fits any model
    if (mn > S - n)  // n + mn could overflow
      fail("{} ({} tokens) + --max-new-tokens ({}) exceeds the model's context of {} tokens (its --seq-length): "
           "use --max-new-tokens {} or less",
           what, n, mn, S, S - n);
    inference::Request r;
    r.prompt = j.ids;
    r.max_new_tokens = mn;
    r.sampling = {l.temperature.value_or(temperature), l.top_k.value_or(top_k), l.top_p.value_or(top_p),
                  l.seed.value_or(seed)};
    inference::check_sampling(r.sampling, single ? "--" : what + ": ");
    if (tok.eod() >= 0 && tok.eod() < engine.vocab_size()) r.stop_tokens = {tok.eod()};
    r.stop_strings = l.stop.value_or(stops);
    r.on_done = [&j](inference::RequestId, const inference::Completion& c) { j.result = c; };
    engine.submit(std::move(r));
  }
  {
    Activity generating("generating");
    engine.run_until_idle();
  }
  if (ranks.world) ranks.world->shutdown();
  if (env.rank != 0) return 0;  // every rank holds the same results

  if (single) {
    std::printf("%s%s\n", prompt.c_str(),
                continuation(tok, jobs[0].ids, jobs[0].result.tokens, prompt.empty()).c_str());
    return 0;
  }
  std::FILE* out = stdout;
  if (!output.empty()) {
    out = std::fopen(output.c_str(), "w");
    if (!out) fail("--output: cannot write '{}'", output);
  }
  for (size_t i = 0; i < jobs.size(); ++i) {
    const Job& j = jobs[i];
    std::vector<int32_t> gen = j.result.tokens;
    if (j.result.reason == inference::FinishReason::StopToken && !gen.empty()) gen.pop_back();  // not text
    std::string text = continuation(tok, j.ids, gen, j.prompt.empty());
    if (j.result.reason == inference::FinishReason::StopString) {
      const std::vector<std::string> ss = {j.result.stop_string};
      text = text.substr(0, std::min(text.size(), inference::find_stop(text, ss)));
    }
    nlohmann::json o = {{"index", i},
                        {"prompt", j.prompt},
                        {"text", text},
                        {"tokens", j.result.tokens},
                        {"prompt_tokens", j.result.prompt_tokens},
                        {"finish_reason", inference::finish_reason_name(j.result.reason)}};
    const std::string s = o.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
    std::fputs(s.c_str(), out);
  }
  if (out != stdout && std::fclose(out) != 0) fail("--output: writing '{}' failed (disk full?)", output);
  return 0;
}

}  // namespace mt
