// ktrace: a CUPTI activity tracer loaded into any CUDA program through CUDA_INJECTION64_PATH. It records every
// kernel's, copy's and memset's GPU start and end (graph nodes included, which ncu serialises and so cannot show) and
// writes them as CSV (start_ns,end_ns,stream,correlation,graph_node,name) to $KTRACE_OUT (default ktrace.csv) at exit.
// Why: a decode step's time is its kernels plus the gaps between them (launch latency, graph boundaries, joins), and
// only a real timeline separates the two. Built on the GPU machine by bench/ktrace/build.sh against that machine's
// CUPTI; bench/ktrace/report.py turns the CSV into per-kernel and per-gap tables. KTRACE_API=1 adds the host's CUDA
// runtime calls (stream "api", name "api:<function>"; host start and end on the same clock): which launch the host was
// issuing while the GPU sat idle.
#include <cupti_activity.h>
#include <cupti_callbacks.h>
#include <stdio.h>
#include <stdlib.h>

#if !defined(KTRACE_RECORD) || !defined(KTRACE_MEMCPY) || !defined(KTRACE_MEMSET)
#error \
    "define KTRACE_RECORD / KTRACE_MEMCPY / KTRACE_MEMSET as the newest CUpti_ActivityKernelN / MemcpyN / MemsetN (build.sh does)"
#endif

static FILE* out;

static void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *size = (size_t)32 << 20;
  *buffer = (uint8_t*)aligned_alloc(8, *size);
  *max_records = 0;
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t* buffer, size_t size, size_t valid) {
  (void)ctx, (void)stream, (void)size;
  CUpti_Activity* rec = NULL;
  while (cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
    if (rec->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
      const KTRACE_MEMCPY* m = (const KTRACE_MEMCPY*)rec;
      fprintf(out, "%llu,%llu,%u,%u,%llu,memcpy kind %u %llu bytes\n", (unsigned long long)m->start,
              (unsigned long long)m->end, m->streamId, m->correlationId, (unsigned long long)m->graphNodeId,
              (unsigned)m->copyKind, (unsigned long long)m->bytes);
      continue;
    }
    if (rec->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
      const KTRACE_MEMSET* m = (const KTRACE_MEMSET*)rec;
      fprintf(out, "%llu,%llu,%u,%u,%llu,memset %llu bytes\n", (unsigned long long)m->start, (unsigned long long)m->end,
              m->streamId, m->correlationId, (unsigned long long)m->graphNodeId, (unsigned long long)m->bytes);
      continue;
    }
    if (rec->kind == CUPTI_ACTIVITY_KIND_RUNTIME) {
      const CUpti_ActivityAPI* a = (const CUpti_ActivityAPI*)rec;
      const char* fn = NULL;
      if (cuptiGetCallbackName(CUPTI_CB_DOMAIN_RUNTIME_API, a->cbid, &fn) != CUPTI_SUCCESS || !fn) fn = "?";
      fprintf(out, "%llu,%llu,api,%u,0,api:%s\n", (unsigned long long)a->start, (unsigned long long)a->end,
              a->correlationId, fn);
      continue;
    }
    if (rec->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && rec->kind != CUPTI_ACTIVITY_KIND_KERNEL) continue;
    const KTRACE_RECORD* k = (const KTRACE_RECORD*)rec;
    fprintf(out, "%llu,%llu,%u,%u,%llu,%s\n", (unsigned long long)k->start, (unsigned long long)k->end, k->streamId,
            k->correlationId, (unsigned long long)k->graphNodeId, k->name ? k->name : "?");
  }
  size_t dropped = 0;
  if (cuptiActivityGetNumDroppedRecords(NULL, 0, &dropped) == CUPTI_SUCCESS && dropped != 0)
    fprintf(stderr, "ktrace: %zu records dropped\n", dropped);
  free(buffer);
}

static void flush_at_exit(void) {
  cuptiActivityFlushAll(1);
  if (out) fclose(out);
  out = NULL;
}

int InitializeInjection(void) {
  const char* path = getenv("KTRACE_OUT");
  out = fopen(path ? path : "ktrace.csv", "w");
  if (!out) return 0;
  fprintf(out, "start_ns,end_ns,stream,correlation,graph_node,name\n");
  if (cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS ||
      cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS ||
      cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY) != CUPTI_SUCCESS ||
      cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET) != CUPTI_SUCCESS) {
    fprintf(stderr, "ktrace: could not enable CUPTI kernel activity\n");
    return 0;
  }
  const char* api = getenv("KTRACE_API");
  if (api && api[0] == '1' && cuptiActivityEnable(CUPTI_ACTIVITY_KIND_RUNTIME) != CUPTI_SUCCESS)
    fprintf(stderr, "ktrace: could not enable CUPTI runtime API activity\n");
  atexit(flush_at_exit);
  return 1;
}
