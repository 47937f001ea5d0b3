#include "core/env.h"

#include <cstdlib>
#include <cstring>
#include <mutex>

#include "core/logging.h"
#include "deepinfer/error.h"

extern char** environ;

namespace deepinfer {

const std::vector<EnvVar>& env_vars() {
  static const std::vector<EnvVar> vars = {
      {"DEEPINFER_LOG_LEVEL", "info", "log verbosity: debug, info, warn, error", true},
      {"DEEPINFER_NUM_THREADS", "all cores", "CPU backend threads (OpenMP)", true},
      {"DEEPINFER_DEVICE", "auto", "where the model runs: cuda, cpu, or auto (cuda when a GPU is visible)", true},
      {"DEEPINFER_BATCH_INVARIANT", "1",
       "1: every GEMM row sums in a fixed order whatever the batch (bitwise batch invariance); 0: large "
       "batches use OpenBLAS",
       true},
      {"DEEPINFER_CUDA_GEMM", "exact",
       "CUDA linear kernel for FP8/FP4 weights and the BF16 vocabulary head: exact (bit-identical to the CPU op), tc "
       "(tensor cores, within "
       "tolerance) or auto (tc from 64 rows up; not batch-invariant)",
       true},
      {"DEEPINFER_CUDA_TC_GROUPED_ROWS", "32",
       "tuning: under DEEPINFER_CUDA_GEMM=tc, from how many grouped rows (the routed experts' (token, expert) pairs) "
       "the tensor-core GEMM reads each expert once per tile of its rows instead of the GEMV once per row; same bits "
       "either way",
       true},
      {"DEEPINFER_CUDA_TC_STREAM", "1",
       "tuning (A/B): under DEEPINFER_CUDA_GEMM=tc, one-row calls through linear_tc_stream.cu (the weight streamed "
       "through shared memory) instead of the decode GEMV's register rings: 0 never, 1 dense E4M3 calls of ~26 MB and "
       "more and one token's routed FP4 experts, 2 every call it takes; same bits either way",
       true},
      {"DEEPINFER_CUDA_GEMV_ROWS", "4096",
       "tuning: the most rows of x that the exact CUDA linear sends to the decode GEMV (E4M3 / BF16 weights; 1 keeps "
       "calls of 2+ rows on the slab kernels); same bits either way",
       true},
      {"DEEPINFER_CUDA_FP4_GEMM_ROWS", "64",
       "tuning: from how many rows of x per matrix (a dense call's rows; a grouped call's rows per expert on average, "
       "rows sorted by expert: prefill chunks) the exact CUDA linear takes the tiled FP4 GEMM (each weight stage "
       "decoded once for 16 rows of x) instead of the grouped GEMV or the slab kernels; 0 never; same bits either way",
       true},
      {"DEEPINFER_CUDA_FP8_GEMM_ROWS", "65",
       "tuning: from how many rows of x the exact CUDA linear takes the tiled E4M3 GEMM (each weight tile decoded once "
       "for 32 rows of x) instead of the GEMV or the slab kernels; 0 never; same bits either way",
       true},
      {"DEEPINFER_CUDA_WGMMA_PIPE", "1",
       "tuning (A/B): fp8_wgmma_gemv at one row of x: 1 pipelines its stage loop two stages deep and runs two blocks "
       "per SM when the weight has more 64-row units than SMs; 2 the pipeline alone; 0 neither; same bits either way",
       true},
      {"DEEPINFER_CUDA_WALK_WHOLE", "1",
       "tuning (A/B): 1 runs fp8_walk_gemv in its whole-chunk form (a lane per 32-column tile and weight row, no "
       "shuffle exchange) where every weight row is read by one x row; 0 in the pair form (two lanes per tile) "
       "everywhere; same bits either way",
       true},
      {"DEEPINFER_CUDA_WALK_BULK", "0",
       "tuning (A/B): 1 feeds fp8_walk_gemv's whole-chunk form from a per-warp ring of bulk copies (cp.async.bulk) "
       "into shared memory instead of its lanes' register ring; 0 the register ring; same bits either way (not yet "
       "measured: off by default)",
       true},
      {"DEEPINFER_CUDA_WALK_BULK_STAGES", "4",
       "tuning (A/B): item stages per warp in fp8_walk_gemv's bulk ring (DEEPINFER_CUDA_WALK_BULK), 2 to 8 (fewer "
       "where "
       "they do not fit shared memory); 0 as many as fit; same bits either way",
       true},
      {"DEEPINFER_CUDA_MOE_DISPATCH", "1",
       "tuning (A/B): 1 routes, groups and gathers a one-token MoE in one launch (ops::moe_dispatch) instead of three; "
       "0 the three launches; same bits either way",
       true},
      {"DEEPINFER_CUDA_WALK_MIN_ROWS", "2048",
       "tuning (A/B): dense E4M3 calls of one row of x on weights of at least this many rows take fp8_walk_gemv (a "
       "warp per 2-4 weight rows over all of K) instead of fp8_gemv (K split across a block); same bits either way",
       true},
      {"DEEPINFER_CUDA_WGMMA_ROWS", "1",
       "tuning (A/B): dense E4M3 calls of 2 up to this many rows of act-quantised x (at most 4) on weights of 4,096+ "
       "rows take fp8_wgmma_gemv, the rows' diagonals sharing one MMA per tile; 1 keeps it at one row of x (on "
       "16,384+ rows); same bits either way",
       true},
      {"DEEPINFER_CUDA_INDEX_GROUP", "auto",
       "tuning (A/B): keys per warp group of the CUDA indexer's decode kernel (8, 16 or 32; larger groups share each "
       "query load among more keys, smaller ones spread short rows over more warps); auto picks by the call's rows x "
       "keys (16 from 16k rows x keys, else 8); the same scores either way",
       true},
      {"DEEPINFER_CUDA_TOPK_STAGE", "2",
       "tuning (A/B): where the CUDA top-k (the indexers' picks) keeps a row's keys in launches of up to 64 rows: 2 "
       "(default) a decode row of 8k+ keys listed by index over a cluster of 8 CTAs, each staging a slice in shared "
       "memory, else as 1; 1 staged in one block's shared memory (rows of up to ~57k keys); 0 read from global memory "
       "on every pass; the same indices either way",
       true},
      {"DEEPINFER_CUDA_WHOLE_TABLES", "0",
       "A/B: 1 gathers every row of a layer's state (window rows, compressed entries, index keys) into one table per "
       "CUDA decode step, as before; 0 (default) gathers only the rows the attention's index lists name (at most "
       "window + index_topk a query row) and lets the indexers read their keys where they are; same bits either way",
       true},
      {"DEEPINFER_CUDA_SIDE_ROWS", "4",
       "tuning (A/B): decode steps of at most this many rows run independent work (the shared expert beside the "
       "routed experts, the attention's side projections) on a second CUDA stream; 0 never; same bits either way",
       true},
      {"DEEPINFER_CUDA_BMMA", "0",
       "tuning (A/B): 1 sends the E4M3 decode GEMV calls that read each weight row once (one row of x, or one per "
       "matrix of a grouped call: wo_b, wo_a, the shared expert, wq_a + wkv) to fp8_bmma_gemv (the weights as the "
       "tensor cores' B operand, 8 rows a warp) instead of fp8_walk_gemv / fp8_gemv; same bits either way (measured "
       "slower: +226 us a batch-1 step on the H100)",
       true},
      {"DEEPINFER_CUDA_BMMA_DEPTH", "4",
       "tuning (A/B): 128-byte weight segments in flight per lane in fp8_bmma_gemv, 4 or 8; same bits either way",
       true},
      {"DEEPINFER_CUDA_BMMA_WARPS", "4",
       "tuning (A/B): warps a block in fp8_bmma_gemv, 4, 2 or 1 (fewer spread a narrow weight over more SMs); same "
       "bits either way",
       true},
      {"DEEPINFER_CUDA_NORM_PREFETCH", "1",
       "tuning (A/B): 1 loads the norm weights of the register-held CUDA norms (rms_norm, hc_collapse_norm, "
       "attn_input_norms) and the decode attention's sinks before griddepcontrol.wait, so that their HBM latency "
       "passes under the previous kernel (~17-20 us a batch-1 step on the H100, for the norms); 0 where they are "
       "used; same bits either way",
       true},
      {"DEEPINFER_CUDA_GRAPHS", "1",
       "1 replays the decode step's dense pieces (between two attentions) as CUDA graphs, one set per batch size of "
       "at most DEEPINFER_CUDA_GRAPH_MAX_BATCH rows (captured at its second step); 0 launches every kernel; same bits "
       "either way",
       true},
      {"DEEPINFER_CUDA_GRAPH_MAX_BATCH", "128", "the largest decode batch whose step is replayed as CUDA graphs", true},
      {"DEEPINFER_CUDA_GRAPH_MIDDLES", "2",
       "tuning: 1 or 2 runs a replayed decode step's attention middles inside the graphs (launches deferred in "
       "spans of a few layers, each launched as one CUDA graph whose middle kernels take the step's parameters; 1 "
       "ends a span after a piece, 2 opens it with one); 0 launches each middle's kernels eagerly between the "
       "pieces' graphs; same bits either way",
       true},
      {"DEEPINFER_CUDA_PDL", "1",
       "tuning: 1 launches the CUDA kernels with programmatic dependent launch (a kernel's launch overlaps the "
       "previous one's tail); 0 launches them plainly; same bits either way",
       true},
      {"DEEPINFER_OP_PROFILE", "0",
       "debugging: 1 times every op (synchronising the device around it) and every device copy, printed at exit; "
       "gpu times each CUDA op's GPU work with events, without synchronising; host times each op's host side "
       "(checks, allocations, launches), without synchronising",
       true},
      {"DEEPINFER_DUMP_DIR", "", "debugging: write named intermediate tensors of each forward there", true},
      {"DEEPINFER_FORCE_DIR", "", "debugging: replace named V4.1 stream tensors by the files there (teacher forcing)",
       true},
      {"DEEPINFER_V4_TOKENIZER", "", "tests: path of the DeepSeek-V4 tokenizer.json", true},
      {"DEEPINFER_BUILD_DIR", "build", "tests: the CMake build directory", true},
      {"DEEPINFER_TEST_GPU", "0", "tests: 1 runs the tests marked gpu", true},
      {"DEEPINFER_JOBS", "all cores", "make: build and test parallelism", true},
      {"DEEPINFER_HF_MODEL_DIR", "", "model directory used by examples when --model is not given", false},
      {"DEEPINFER_ENABLE_MTP_VARLEN", "0", "DSpark speculative decoding with confidence-scheduled verification", false},
      {"DEEPINFER_USE_NEXTN_DECODE", "5", "maximum DSpark draft length", false},
      {"DEEPINFER_YOCO_PREFILL_TRUNCATION_MODE", "compact",
       "V4.1 SWA bounded replay: compact = decoder layers prefill only the last KEEP_TOKENS; off = exact", true},
      {"DEEPINFER_YOCO_PREFILL_KEEP_TOKENS", "140", "tokens the V4.1 decoder replays (window + margin)", true},
      {"DEEPINFER_SO_PREBUILD", "1",
       "structured outputs: 0 skips building the JSON loop entries once per vocabulary (benchmarks of a fresh process)",
       true},
  };
  return vars;
}

std::string env_value(const char* name) {
  if (const char* v = std::getenv(name)) return v;
  for (const EnvVar& v : env_vars())
    if (std::strcmp(v.name, name) == 0) return v.default_value;
  throw std::logic_error(std::string("env_value: ") + name + " is not in the DEEPINFER_* table");
}

int64_t env_int(const char* name, int64_t min_value) {
  const std::string v = env_value(name);
  char* end = nullptr;
  const long long n = std::strtoll(v.c_str(), &end, 10);
  DI_CHECK(end != v.c_str() && *end == '\0' && n >= min_value, "{} must be a whole number >= {} (got '{}')", name,
           min_value, v);
  return static_cast<int64_t>(n);
}

int env_switch(const char* name, int max_value) {
  const std::string v = env_value(name);
  DI_CHECK(v.size() == 1 && v[0] >= '0' && v[0] - '0' <= max_value, "{} must be a digit from 0 to {} (got '{}')", name,
           max_value, v);
  return v[0] - '0';
}

void check_env() {
  static std::once_flag once;
  std::call_once(once, [] {
    for (char** e = environ; e && *e; ++e) {
      const char* kv = *e;
      if (std::strncmp(kv, "DEEPINFER_", 10) != 0) continue;
      const char* eq = std::strchr(kv, '=');
      std::string name(kv, eq ? static_cast<size_t>(eq - kv) : std::strlen(kv));
      const EnvVar* known = nullptr;
      for (const EnvVar& v : env_vars())
        if (name == v.name) known = &v;
      if (!known)
        log_warn("{} is not a deepinfer variable (ignored); `deepinfer env` lists them", name);
      else if (!known->supported)
        log_warn("{} is not supported yet by this build (ignored): {}", name, known->meaning);
    }
  });
}

std::string env_table() {
  std::string out;
  for (const EnvVar& v : env_vars()) {
    const char* cur = std::getenv(v.name);
    out += fmt::format("{:<40} {:<10} {}\n    default: {}{}\n", v.name, v.supported ? "supported" : "not yet",
                       v.meaning, v.default_value[0] ? v.default_value : "(unset)",
                       cur ? fmt::format("; now: {}", cur) : std::string());
  }
  return out;
}

}  // namespace deepinfer
