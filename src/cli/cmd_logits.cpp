// `deepinfer logits`: float32 little-endian logits [n_tokens, vocab] for every position, by one
// prefill forward or (--decode) one token at a time; --trace dumps routed experts, indexer picks and
// (V4.1) candidate blocks.
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "cli/commands.h"
#include "deepinfer/error.h"
#include "model/model.h"

namespace deepinfer::cli {

namespace {
void write_file(const std::string& path, const void* data, size_t n) {
  std::ofstream f(path, std::ios::binary);
  DI_CHECK(f.good(), "cannot open {} for writing", path);
  f.write(static_cast<const char*>(data), static_cast<std::streamsize>(n));
  DI_CHECK(f.good(), "failed writing {}", path);
}
}  // namespace

Runner add_logits(CLI::App& app) {
  struct Opts {
    std::string model, ids, out, trace;
    bool decode = false;
    int chunk = 0;
    int decode_from = 0;
    NumericsFlags num;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = app.add_subcommand("logits", "write the logits of every position of a token sequence");
  cmd->add_option("--model", o->model, "model directory (config.json + safetensors)")->required();
  cmd->add_option("--input-ids", o->ids,
                  "comma-separated token ids; several sequences separated by ';' run as one batch")
      ->required();
  cmd->add_option("--out", o->out, "output file: float32 [n_tokens, vocab]")->required();
  cmd->add_option("--trace", o->trace, "directory for routed experts / indexer picks (int32 files)");
  cmd->add_flag("--decode", o->decode, "run one token per forward through the decode path");
  cmd->add_option("--chunk", o->chunk, "chunked prefill: at most this many tokens per forward")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--decode-from", o->decode_from,
                  "prefill the first N tokens in one forward, then decode the rest one token per forward")
      ->check(CLI::PositiveNumber);
  o->num.add(cmd);
  return [o] {
    std::vector<std::vector<int32_t>> seqs;
    for (size_t i = 0; i <= o->ids.size();) {
      size_t j = o->ids.find(';', i);
      if (j == std::string::npos) j = o->ids.size();
      seqs.push_back(parse_ids(o->ids.substr(i, j - i), "--input-ids"));
      i = j + 1;
    }
    auto model = Model::load(o->model, o->num.resolved_device());
    const ModelConfig& cfg = model->config();
    Trace trace;
    ForwardOptions fo{o->num.numerics(), true, o->trace.empty() ? nullptr : &trace};
    DI_CHECK(seqs.size() == 1 || o->trace.empty(), "--trace takes a single sequence");
    // Every step runs the next chunk of every sequence that has tokens left, as one batch.
    std::vector<std::unique_ptr<SequenceState>> states;
    std::vector<std::vector<float>> per_seq(seqs.size());
    for (size_t b = 0; b < seqs.size(); ++b) states.push_back(model->new_sequence());
    size_t longest = 0;
    for (const auto& s : seqs) longest = std::max(longest, s.size());
    DI_CHECK(o->decode_from == 0 || (!o->decode && o->chunk == 0), "--decode-from takes neither --decode nor --chunk");
    const size_t chunk = o->decode ? 1 : (o->chunk > 0 ? static_cast<size_t>(o->chunk) : longest);
    for (size_t i = 0, step = o->decode_from > 0 ? static_cast<size_t>(o->decode_from) : chunk;
         i<longest; i += step, step = o->decode_from> 0 ? 1 : chunk) {
      std::vector<SeqChunk> batch;
      std::vector<size_t> who;
      for (size_t b = 0; b < seqs.size(); ++b) {
        if (i >= seqs[b].size()) continue;
        std::vector<int32_t> part(seqs[b].begin() + i, seqs[b].begin() + std::min(seqs[b].size(), i + step));
        batch.push_back(SeqChunk{states[b].get(), std::move(part), true, true});
        who.push_back(b);
      }
      Tensor out = model->forward_batch(batch, fo);
      const float* p = out.data<float>();
      for (size_t k = 0; k < batch.size(); ++k) {
        const size_t n = batch[k].tokens.size() * cfg.vocab_size;
        per_seq[who[k]].insert(per_seq[who[k]].end(), p, p + n);
        p += n;
      }
    }
    std::vector<float> logits;
    size_t total = 0;
    for (const auto& s : seqs) total += s.size();
    for (auto& v : per_seq) logits.insert(logits.end(), v.begin(), v.end());
    write_file(o->out, logits.data(), logits.size() * sizeof(float));
    if (!o->trace.empty()) {
      std::filesystem::create_directories(o->trace);
      for (const auto& [l, v] : trace.experts)
        write_file(o->trace + "/experts.L" + std::to_string(l) + ".i32", v.data(), v.size() * 4);
      for (const auto& [l, v] : trace.indexer)
        write_file(o->trace + "/indexer.L" + std::to_string(l) + ".i32", v.data(), v.size() * 4);
      for (const auto& [l, v] : trace.candidates)
        write_file(o->trace + "/candidates.L" + std::to_string(l) + ".i32", v.data(), v.size() * 4);
    }
    std::fprintf(stderr, "wrote %zu x %lld logits to %s\n", total, static_cast<long long>(cfg.vocab_size),
                 o->out.c_str());
    return 0;
  };
}

}  // namespace deepinfer::cli
